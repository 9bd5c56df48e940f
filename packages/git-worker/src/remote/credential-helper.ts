#!/usr/bin/env node
/**
 * git's credential helper for https volumes: `credential-helper.js <socket> <ticket> get`.
 * It asks the git worker over its private socket for the credential of one
 * ticket, and hands it to git on stdout: a pipe, never a file.
 */
import * as net from "node:net";

const [socketPath, ticket, action] = process.argv.slice(2);
// git also calls helpers to store and erase; the worker keeps nothing git could store.
if (action !== "get" || !socketPath || !ticket) process.exit(0);
process.stdin.resume();
const connection = net.createConnection(socketPath, () => connection.end(`${ticket}\n`));
const chunks: Buffer[] = [];
connection.on("data", (chunk: Buffer) => chunks.push(chunk));
connection.on("end", () => process.stdout.write(Buffer.concat(chunks), () => process.exit(0)));
connection.on("error", () => process.exit(1));
