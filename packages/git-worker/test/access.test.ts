import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { RemoteAccess } from "../src/remote/access";
import { CredentialBroker } from "../src/remote/broker";
import { tempDir } from "./remote";

/** A fresh ed25519 key, as a Secret's ssh-privatekey holds it. */
function privateKey(dir: string, name: string): string {
  const file = path.join(dir, name);
  execFileSync("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", "volume-key", "-f", file]);
  return execFileSync("cat", [file], { encoding: "utf8" });
}

/** The agent socket the access hands ssh, read from the command git runs. */
async function agentSocket(access: RemoteAccess): Promise<string> {
  const command = await access.run(async (options) => options.env.GIT_SSH_COMMAND!);
  return /IdentityAgent=(\S+)/.exec(command)![1]!;
}

test("an opened ssh access has its agent listening with the volume's key in it, at once", async (t) => {
  const dir = await tempDir(t, "agent");
  const broker = new CredentialBroker(path.join(dir, "broker.sock"));
  await fs.mkdir(path.join(dir, "sockets"));
  // Several at once, as a node staging many volumes: each open resolves only once its own agent holds the key.
  const opened = await Promise.all(
    [1, 2, 3, 4].map((i) => RemoteAccess.open({ kind: "ssh", privateKey: privateKey(dir, `key-${i}`) }, path.join(dir, `volume-${i}`), path.join(dir, "sockets"), broker)),
  );
  t.after(() => opened.forEach((access) => access.close()));
  for (const access of opened) {
    const listed = execFileSync("ssh-add", ["-l"], { env: { PATH: process.env.PATH, SSH_AUTH_SOCK: await agentSocket(access) }, encoding: "utf8" });
    assert.match(listed, /volume-key \(ED25519\)/);
  }
});

test("an ssh-agent that cannot start fails the open with its own words, not as a bad key", async (t) => {
  const dir = await tempDir(t, "agent");
  const broker = new CredentialBroker(path.join(dir, "broker.sock"));
  const started = Date.now();
  await assert.rejects(
    RemoteAccess.open({ kind: "ssh", privateKey: privateKey(dir, "key") }, path.join(dir, "volume"), path.join(dir, "absent"), broker),
    (err: Error) => /the volume's ssh-agent did not start at .*: it exited \(code 1\) .*cannot bind/.test(err.message) && !/not a usable key/.test(err.message),
  );
  // Its exit is the answer: no fixed wait for a socket that never comes.
  assert.ok(Date.now() - started < 2000, `the open took ${Date.now() - started} ms`);
});
