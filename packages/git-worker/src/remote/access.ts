import { type ChildProcess, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs/promises";
import * as net from "node:net";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { type GitCredential, orAbsent } from "@git-csi/config";
import type { CredentialBroker } from "./broker";

/** What a git command that talks to the remote needs: -c settings and environment. */
export interface RemoteOptions {
  config: string[];
  env: Record<string, string>;
}

const HELPER = path.join(__dirname, "credential-helper.js");

/**
 * How one volume reaches its remote with its credential, in memory only. An
 * ssh key lives in an ssh-agent of the volume's own, fed on stdin (so no key
 * file exists and no other volume's key is ever offered); an https credential
 * is handed to git's credential helper per operation by the broker.
 */
export class RemoteAccess {
  /** Tells credentials apart without keeping one: volumes with the same identity may share a push. */
  readonly identity: string;

  private constructor(
    private readonly credential: GitCredential | undefined,
    private readonly base: RemoteOptions,
    private readonly broker: CredentialBroker,
    private readonly agent?: ChildProcess,
  ) {
    this.identity = createHash("sha256")
      .update(JSON.stringify(credential ?? null))
      .digest("hex");
  }

  /** True unless an ssh credential came without known_hosts: then the first host key seen is trusted. */
  get hostKeyVerified(): boolean {
    return this.credential?.kind !== "ssh" || this.credential.knownHosts !== undefined;
  }

  get hasCredential(): boolean {
    return this.credential !== undefined;
  }

  static async open(credential: GitCredential | undefined, volumeDir: string, socketDir: string, broker: CredentialBroker): Promise<RemoteAccess> {
    // Never a prompt, never a user's or the system's helper or ssh config.
    const config = ["credential.helper="];
    const env: Record<string, string> = {};
    if (credential?.kind !== "ssh") {
      env.GIT_SSH_COMMAND = "ssh -F /dev/null -o BatchMode=yes";
      return new RemoteAccess(credential, { config, env }, broker);
    }
    await fs.mkdir(volumeDir, { recursive: true });
    let hostKeys: string[];
    if (credential.knownHosts) {
      const file = path.join(volumeDir, "known_hosts");
      await fs.writeFile(file, credential.knownHosts.endsWith("\n") ? credential.knownHosts : `${credential.knownHosts}\n`);
      hostKeys = ["-o", `UserKnownHostsFile=${file}`, "-o", "StrictHostKeyChecking=yes"];
    } else {
      hostKeys = ["-o", `UserKnownHostsFile=${path.join(volumeDir, "known_hosts.first-seen")}`, "-o", "StrictHostKeyChecking=accept-new"];
    }
    // A socket of its own per agent: an agent that exits unlinks its path, which must never be its successor's.
    const socket = path.join(socketDir, `${AGENT_PREFIX}${randomBytes(8).toString("hex")}.sock`);
    const agent = await startAgent(socket, credential.privateKey);
    env.GIT_SSH_COMMAND = ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", `IdentityAgent=${socket}`, "-o", "GlobalKnownHostsFile=/dev/null", ...hostKeys].join(" ");
    return new RemoteAccess(credential, { config, env }, broker, agent);
  }

  /** Runs one git operation against the remote with the credential. */
  run<T>(operation: (options: RemoteOptions) => Promise<T>): Promise<T> {
    const credential = this.credential;
    if (credential?.kind !== "basic" && credential?.kind !== "token") return operation(this.base);
    const secret = credential.kind === "basic" ? { username: credential.username, password: credential.password } : { username: credential.username, password: credential.token };
    return this.broker.withTicket(secret, (ticket) =>
      operation({ ...this.base, config: [...this.base.config, `credential.helper=!"${process.execPath}" "${HELPER}" "${this.broker.socketPath}" ${ticket}`] }),
    );
  }

  close(): void {
    this.agent?.kill();
  }
}

const AGENT_PREFIX = "agent-";

/**
 * Ends the ssh-agents a previous worker of this state directory left running:
 * a worker that was killed could not, and each still holds a key in memory.
 */
export async function endOrphanedAgents(socketDir: string): Promise<number> {
  const marker = `\0-a\0${path.join(socketDir, AGENT_PREFIX)}`;
  let ended = 0;
  for (const pid of await fs.readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    // A process that exited since the listing is no agent.
    const cmdline = (await orAbsent(fs.readFile(`/proc/${pid}/cmdline`, "latin1"))) ?? "";
    if (!cmdline.startsWith("ssh-agent\0") || !cmdline.includes(marker)) continue;
    try {
      process.kill(Number(pid), "SIGTERM");
      ended++;
    } catch {
      // Gone already.
    }
  }
  return ended;
}

/** How long an ssh-agent may take to listen; a busy node is slow, an agent that never listens is broken. */
const AGENT_START_MS = 10_000;

async function startAgent(socket: string, privateKey: string): Promise<ChildProcess> {
  await fs.rm(socket, { force: true });
  const agent = spawn("ssh-agent", ["-D", "-a", socket], { stdio: ["ignore", "ignore", "pipe"] });
  try {
    await agentListening(agent, socket);
    await addKey(socket, privateKey);
  } catch (err) {
    agent.kill();
    throw err;
  }
  return agent;
}

/**
 * Resolves once the agent accepts a connection on its socket: the file
 * appears at bind(), before listen(), so its presence alone proves nothing.
 * Rejects with the agent's own words when it exits or cannot run, and after
 * AGENT_START_MS when it never listens.
 */
async function agentListening(agent: ChildProcess, socket: string): Promise<void> {
  let stderr = "";
  agent.stderr?.on("data", (c: Buffer) => (stderr = (stderr + c.toString()).slice(-2000)));
  let failure: Error | undefined;
  const fail = (why: string) => (failure ??= new Error(`the volume's ssh-agent did not start at ${socket}: ${why}`));
  agent.once("error", (err) => fail(err.message));
  agent.once("exit", (code, signal) => fail(`it exited (${signal ?? `code ${code}`}) ${stderr.trim()}`.trim()));
  const deadline = Date.now() + AGENT_START_MS;
  while (!(await accepts(socket))) {
    if (failure) throw failure;
    if (Date.now() >= deadline) throw fail(`it did not listen within ${AGENT_START_MS / 1000} s`);
    await sleep(20);
  }
}

/** True when a unix socket accepts a connection now. */
function accepts(socket: string): Promise<boolean> {
  return new Promise((resolve) => {
    const connection = net.connect(socket, () => {
      connection.destroy();
      resolve(true);
    });
    connection.once("error", () => resolve(false));
  });
}

/** The key into the agent, on stdin: no key file ever exists. */
function addKey(socket: string, privateKey: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const add = spawn("ssh-add", ["-q", "-"], { env: { PATH: process.env.PATH ?? "/usr/bin:/bin", SSH_AUTH_SOCK: socket }, stdio: ["pipe", "ignore", "pipe"] });
    let stderr = "";
    add.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    add.once("error", reject);
    add.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`the ssh-privatekey of the volume's Secret is not a usable key: ${stderr.trim()}`))));
    add.stdin.end(privateKey);
  });
}
