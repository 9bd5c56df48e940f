// Test helper: a REAL git-over-SSH server (Debian's OpenSSH sshd) serving
// bare repositories from a private temp dir on 127.0.0.1:<ephemeral port>, or
// on an address inside a network namespace the test made (the cluster tests).
//
//   const srv = await startSshGitServer();
//   await srv.createRepo("demo.git", { files: { "a.txt": "A\n" } });
//   const key = await srv.addDeployKey("ci");   // ed25519, no passphrase
//   // write key.privateKey to a 0600 file, srv.hostKeyLine to a known_hosts file, then
//   // GIT_SSH_COMMAND="ssh -i KEY -o IdentitiesOnly=yes -o UserKnownHostsFile=KH -o StrictHostKeyChecking=yes"
//   //   git clone srv.url("demo.git")
//   await srv.revokeDeployKey("ci");
//   await srv.stop();
//
// sshd runs in the foreground (-D -e) as a child of the test process with its
// own sshd_config, host key, PidFile and authorized_keys, all in the temp dir;
// nothing in /etc/ssh is read and no system service is involved. Needs root
// (sshd can only authenticate other users when it runs as root) and Linux.
//
// The git user is root, but no system user is created and root gets no shell:
// every key in authorized_keys is `restrict,command="... git-shell -c
// \"$SSH_ORIGINAL_COMMAND\""`, so only git-upload-pack / git-receive-pack /
// git-upload-archive run (no pty, no forwarding of any kind). Repositories are
// addressed by absolute path: ssh://root@127.0.0.1:<port>/tmp/.../repos/<repo>.

import { spawn } from "node:child_process";
import { chmodSync, renameSync, writeFileSync } from "node:fs";
import { mkdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import * as path from "node:path";

import { bareRepoOps, type BareRepoOps } from "./git-server";
import { type Launch, type ServedProcess, ServerRoot } from "./server-process";

const SSHD = "/usr/sbin/sshd";
/** Debian's compiled-in privilege separation directory (systemd creates it via RuntimeDirectory=sshd). */
const PRIVSEP_DIR = "/run/sshd";

export interface DeployKey {
  /** OpenSSH private key (PEM-like "-----BEGIN OPENSSH PRIVATE KEY-----" text, trailing newline). */
  privateKey: string;
  /** `ssh-ed25519 AAAA... <name>` (one line, no newline). */
  publicKey: string;
}

export interface SshGitServer extends BareRepoOps {
  readonly port: number;
  /** PID of the sshd listener (its per-connection children are in other sessions). */
  readonly pid: number;
  /** known_hosts line for the server: `[127.0.0.1]:<port> ssh-ed25519 AAAA...` */
  readonly hostKeyLine: string;
  /** ssh://root@127.0.0.1:<port><absolute repo path> */
  url(repo: string): string;
  /**
   * New ed25519 key (no passphrase) allowed to run git commands; `name` is
   * [A-Za-z0-9._-]+ and unique. A read-only key may only fetch, as a forge's
   * read-only deploy key: every push with it is refused.
   */
  addDeployKey(name: string, access?: "read-write" | "read-only"): Promise<DeployKey>;
  /** Remove the key's authorized_keys line; new connections with it are refused. Throws for an unknown name. */
  revokeDeployKey(name: string): Promise<void>;
  /** Kill sshd and every process it started (open connections included), remove the temp dir. Idempotent. */
  stop(): Promise<void>;
}

interface RunResult {
  stdout: string;
  stderr: string;
  code: number | null;
}

/** Run a program (argv, no shell); reject on non-zero exit. */
function run(cmd: string, args: readonly string[]): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, [...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, LC_ALL: "C" } });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.on("data", (b: Buffer) => err.push(b));
    child.on("error", reject);
    child.on("close", (code) => {
      const r = { stdout: Buffer.concat(out).toString("utf8"), stderr: Buffer.concat(err).toString("utf8"), code };
      if (code === 0) resolve(r);
      else reject(new Error(`${cmd} ${args.join(" ")} failed (code ${String(code)}): ${r.stderr.trim()}`));
    });
  });
}

async function ensurePrivsepDir(): Promise<void> {
  try {
    await mkdir(PRIVSEP_DIR, { mode: 0o755 });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
  }
  const st = await stat(PRIVSEP_DIR);
  if (!st.isDirectory()) throw new Error(`${PRIVSEP_DIR} is not a directory`);
}

const KEY_NAME = /^[A-Za-z0-9._-]+$/;

export interface SshServerPlace {
  /** Address to listen on (default 127.0.0.1). */
  address: string;
  /** A network namespace (/run/netns/<name>) to run sshd in, so only that namespace reaches it. */
  netns?: string;
}

export async function startSshGitServer(place: SshServerPlace = { address: "127.0.0.1" }): Promise<SshGitServer> {
  const host = place.address;
  if (process.getuid?.() !== 0) {
    throw new Error("startSshGitServer needs root: sshd only authenticates other users (here: root) when it runs as root");
  }
  await ensurePrivsepDir();

  // the path ends up in sshd_config and inside a quoted forced command
  const root = await ServerRoot.create("git-csi-sshd-", "sshd_config");
  const under = (name: string) => path.join(root.dir, name);
  const baseDir = under("repos");
  const workDir = under("work");
  const keyDir = under("keys");
  const shellHome = under("home"); // HOME for git-shell: no git-shell-commands/ => no interactive commands
  const hostKey = under("ssh_host_ed25519_key");
  const authorizedKeys = under("authorized_keys");
  const configFile = under("sshd_config");

  let hostKeyLine: string;
  let launched: { port: number; pid: number };
  try {
    const [keyType, keyB64] = await prepareDirectories({ baseDir, workDir, keyDir, shellHome, hostKey, authorizedKeys });
    launched = await root.launch("sshd", host, async (port) => {
      await writeFile(configFile, sshdConfig({ host, port, hostKey, authorizedKeys, pidFile: under("sshd.pid") }));
      return launchSshd(configFile, place, `Server listening on ${host} port ${port}.`);
    });
    hostKeyLine = `[${host}]:${launched.port} ${keyType} ${keyB64}`;
  } catch (e) {
    await root.stop();
    throw e;
  }

  const ops = bareRepoOps(baseDir, workDir);
  const keys = new DeployKeys(keyDir, authorizedKeys, `HOME=${shellHome} GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null ` + `exec git-shell -c \\"$SSH_ORIGINAL_COMMAND\\"`);

  const { port, pid } = launched;
  const server: SshGitServer = {
    ...ops,
    port,
    pid,
    hostKeyLine,
    url(repo) {
      return `ssh://root@${host}:${port}${ops.repoPath(repo)}`;
    },
    addDeployKey: (name, access = "read-write") => keys.add(name, access === "read-only"),
    revokeDeployKey: async (name) => keys.revoke(name),
    stop: () => root.stop(),
  };
  return server;
}

/** The private sshd's configuration: root by key only, nothing but git-shell. */
function sshdConfig(at: { host: string; port: number; hostKey: string; authorizedKeys: string; pidFile: string }): string {
  return [
    "# git-csi e2e: private sshd, see e2e/src/ssh-server.ts",
    `ListenAddress ${at.host}`,
    `Port ${at.port}`,
    `AddressFamily inet`,
    `HostKey ${at.hostKey}`,
    `PidFile ${at.pidFile}`,
    `AuthorizedKeysFile ${at.authorizedKeys}`,
    `StrictModes no`,
    `UsePAM no`,
    `PermitRootLogin prohibit-password`,
    `AllowUsers root`,
    `PubkeyAuthentication yes`,
    `PasswordAuthentication no`,
    `KbdInteractiveAuthentication no`,
    `PermitEmptyPasswords no`,
    `HostbasedAuthentication no`,
    `GSSAPIAuthentication no`,
    `AllowTcpForwarding no`,
    `AllowStreamLocalForwarding no`,
    `AllowAgentForwarding no`,
    `X11Forwarding no`,
    `PermitTunnel no`,
    `PermitTTY no`,
    `PermitUserRC no`,
    `PermitUserEnvironment no`,
    `AcceptEnv GIT_PROTOCOL`,
    `PrintMotd no`,
    `PrintLastLog no`,
    `UseDNS no`,
    `LoginGraceTime 30`,
    `MaxStartups 100:30:200`,
    `LogLevel INFO`,
    "",
  ].join("\n");
}

/** Starts sshd; ready once it says it listens, not when it exits or after 10 s. */
async function launchSshd(configFile: string, place: SshServerPlace, listening: string): Promise<Launch> {
  const sshdArgs = ["-D", "-e", "-f", configFile];
  const child = place.netns
    ? spawn("nsenter", [`--net=/run/netns/${place.netns}`, "--", SSHD, ...sshdArgs], { stdio: ["ignore", "ignore", "pipe"] })
    : spawn(SSHD, sshdArgs, { stdio: ["ignore", "ignore", "pipe"] });
  const sshd: ServedProcess = { child, exited: false };
  let stderrTail = "";
  let ready = false;
  let wake: () => void = () => {};
  child.stderr?.on("data", (b: Buffer) => {
    stderrTail = (stderrTail + b.toString("utf8")).slice(-8192);
    if (!ready && stderrTail.includes(listening)) {
      ready = true;
      wake();
    }
  });
  child.on("exit", () => {
    sshd.exited = true;
    wake();
  });
  child.on("error", (e) => {
    sshd.exited = true;
    stderrTail += `\nspawn error: ${e.message}`;
    wake();
  });
  await new Promise<void>((r) => {
    const t = setTimeout(r, 10_000);
    wake = () => {
      clearTimeout(t);
      r();
    };
    if (ready || sshd.exited) wake();
  });
  return { process: sshd, ready: ready && !sshd.exited, why: stderrTail.trim() };
}

/** The deploy keys sshd accepts, each forced to git-shell; sshd re-reads the file on every authentication. */
class DeployKeys {
  /** Name → authorized_keys line. */
  private readonly keys = new Map<string, string>();

  constructor(
    private readonly keyDir: string,
    private readonly authorizedKeys: string,
    private readonly forcedCommand: string,
  ) {}

  async add(name: string, readOnly: boolean): Promise<{ privateKey: string; publicKey: string }> {
    if (!KEY_NAME.test(name)) throw new Error(`invalid deploy key name ${JSON.stringify(name)}`);
    if (this.keys.has(name)) throw new Error(`deploy key ${JSON.stringify(name)} already exists`);
    const file = path.join(this.keyDir, name);
    await rm(file, { force: true });
    await rm(`${file}.pub`, { force: true });
    await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", name, "-f", file]);
    const privateKey = await readFile(file, "utf8");
    // The key lives in the test's memory only, so a scan of /tmp for key material finds none.
    await rm(file, { force: true });
    const publicKey = (await readFile(`${file}.pub`, "utf8")).trim();
    if (this.keys.has(name)) throw new Error(`deploy key ${JSON.stringify(name)} already exists`);
    const command = readOnly ? `case \\"$SSH_ORIGINAL_COMMAND\\" in git-upload-pack*) ${this.forcedCommand};; *) echo 'this deploy key may only fetch' >&2; exit 1;; esac` : this.forcedCommand;
    this.keys.set(name, `restrict,command="${command}" ${publicKey}`);
    this.write();
    return { privateKey, publicKey };
  }

  revoke(name: string): void {
    if (!this.keys.delete(name)) throw new Error(`no deploy key ${JSON.stringify(name)}`);
    this.write();
  }

  /** Replaced atomically: sshd never reads half a file. */
  private write(): void {
    const tmp = `${this.authorizedKeys}.tmp`;
    writeFileSync(tmp, [...this.keys.values()].map((l) => `${l}\n`).join(""), { mode: 0o600 });
    chmodSync(tmp, 0o600);
    renameSync(tmp, this.authorizedKeys);
  }
}

/** The server's directories, its host key and an empty authorized_keys; the host key's type and base64. */
async function prepareDirectories(at: { baseDir: string; workDir: string; keyDir: string; shellHome: string; hostKey: string; authorizedKeys: string }): Promise<string[]> {
  await mkdir(at.baseDir);
  await mkdir(at.workDir);
  await mkdir(at.keyDir, { mode: 0o700 });
  await mkdir(at.shellHome);
  await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", "git-csi-e2e-host", "-f", at.hostKey]);
  await writeFile(at.authorizedKeys, "", { mode: 0o600 });
  return (await readFile(`${at.hostKey}.pub`, "utf8")).trim().split(/\s+/);
}
