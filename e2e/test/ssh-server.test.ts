import { after, before, test } from "node:test";
import * as assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";

import { gitEnv, runGit, runGitRaw } from "../src/git-server";
import { startSshGitServer, type SshGitServer } from "../src/ssh-server";
import { listeningAddrs } from "../src/proc";

let srv: SshGitServer;
let work: string;
let knownHosts: string;

before(async () => {
  srv = await startSshGitServer();
  work = await mkdtemp(path.join(os.tmpdir(), "git-csi-sshd-test-"));
  knownHosts = path.join(work, "known_hosts");
  await writeFile(knownHosts, `${srv.hostKeyLine}\n`);
});

after(async () => {
  await srv?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], timeoutMs = 30_000): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: gitEnv() });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (b: Buffer) => (stdout += b.toString()));
    child.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
    const t = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(t);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Deploy key on the server + its private key in a 0600 file; returns the file. */
async function deployKey(name: string, access: "read-write" | "read-only" = "read-write"): Promise<string> {
  const key = await srv.addDeployKey(name, access);
  assert.match(key.privateKey, /^-----BEGIN OPENSSH PRIVATE KEY-----\n/);
  assert.match(key.publicKey, new RegExp(`^ssh-ed25519 [A-Za-z0-9+/=]+ ${name}$`));
  const file = path.join(work, `${name}.key`);
  await writeFile(file, key.privateKey, { mode: 0o600 });
  return file;
}

function sshOpts(keyFile: string, kh = knownHosts): string[] {
  return ["-F", "/dev/null", "-i", keyFile, "-o", "IdentitiesOnly=yes", "-o", `UserKnownHostsFile=${kh}`, "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"];
}

/** env for git over ssh with this key (all paths are plain temp paths, safe for GIT_SSH_COMMAND's shell). */
const sshEnv = (keyFile: string, kh = knownHosts) => gitEnv({ GIT_SSH_COMMAND: ["ssh", ...sshOpts(keyFile, kh)].join(" ") });

/** Live (non-zombie) descendants of pid. */
function descendants(root: number): number[] {
  const procs: [number, number][] = [];
  for (const ent of readdirSync("/proc")) {
    if (!/^\d+$/.test(ent)) continue;
    try {
      const s = readFileSync(`/proc/${ent}/stat`, "utf8");
      const [state, ppid] = s.slice(s.lastIndexOf(")") + 2).split(" ");
      if (state !== "Z") procs.push([Number(ent), Number(ppid)]);
    } catch {
      /* gone */
    }
  }
  const tree = new Set([root]);
  for (let grew = true; grew;) {
    grew = false;
    for (const [pid, ppid] of procs) {
      if (!tree.has(pid) && tree.has(ppid)) {
        tree.add(pid);
        grew = true;
      }
    }
  }
  tree.delete(root);
  return [...tree];
}

const cmdline = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ");
  } catch {
    return "";
  }
};

const portHex = (port: number) => port.toString(16).toUpperCase().padStart(4, "0");

test("sshd listens only on 127.0.0.1:<port> and pins its host key", async () => {
  assert.match(srv.hostKeyLine, new RegExp(`^\\[127\\.0\\.0\\.1\\]:${srv.port} ssh-ed25519 [A-Za-z0-9+/=]+$`));
  assert.deepEqual(listeningAddrs(srv.pid), [`0100007F:${portHex(srv.port)}`]);
  // sshd rewrites its title: "sshd: /usr/sbin/sshd -D -e -f <tmp>/sshd_config [listener] ..."
  assert.match(cmdline(srv.pid), /\/usr\/sbin\/sshd -D -e -f \/\S+\/sshd_config/);

  await srv.createRepo("pinned.git");
  const key = await deployKey("pin");
  const ok = await runGitRaw(["ls-remote", srv.url("pinned.git")], { env: sshEnv(key) });
  assert.equal(ok.code, 0, ok.stderr);
  assert.match(ok.stdout, /\trefs\/heads\/main\n/);

  // an unknown host key is refused (StrictHostKeyChecking=yes), i.e. hostKeyLine is what made it work
  const emptyKh = path.join(work, "empty_known_hosts");
  await writeFile(emptyKh, "");
  const bad = await runGitRaw(["ls-remote", srv.url("pinned.git")], { env: sshEnv(key, emptyKh) });
  assert.notEqual(bad.code, 0);
  assert.match(bad.stderr, /Host key verification failed/);
});

test("clone and push over ssh with a deploy key", async () => {
  const initial = await srv.createRepo("demo.git", { files: { "hello.txt": "hello\n" } });
  const key = await deployKey("ci");
  const env = sshEnv(key);
  assert.equal(srv.url("demo.git"), `ssh://root@127.0.0.1:${srv.port}${srv.repoPath("demo.git")}`);

  const clone = path.join(work, "clone");
  await runGit(["clone", "--quiet", srv.url("demo.git"), clone], { env });
  assert.equal(await readFile(path.join(clone, "hello.txt"), "utf8"), "hello\n");
  assert.equal(await runGit(["rev-parse", "HEAD"], { cwd: clone }), initial);

  await writeFile(path.join(clone, "hello.txt"), "hello over ssh\n");
  await runGit(["commit", "--quiet", "-am", "over ssh"], { cwd: clone });
  const local = await runGit(["rev-parse", "HEAD"], { cwd: clone });
  await runGit(["push", "--quiet", "origin", "HEAD:refs/heads/main"], { cwd: clone, env });
  assert.equal(await srv.git("demo.git", "rev-parse", "refs/heads/main"), local);
  assert.equal(await srv.git("demo.git", "show", "main:hello.txt"), "hello over ssh");

  // and a server-side commit comes back with a fetch
  const upstream = await srv.commitFiles("demo.git", { "up.txt": "up\n" });
  await runGit(["pull", "--quiet", "--ff-only", "origin", "main"], { cwd: clone, env });
  assert.equal(await runGit(["rev-parse", "HEAD"], { cwd: clone }), upstream);
});

test("a read-only deploy key clones and fetches, and every push with it is refused", async () => {
  await srv.createRepo("readonly.git", { files: { "hello.txt": "hello\n" } });
  const env = sshEnv(await deployKey("reader", "read-only"));
  const clone = path.join(work, "readonly-clone");
  await runGit(["clone", "--quiet", srv.url("readonly.git"), clone], { env });
  assert.equal(await readFile(path.join(clone, "hello.txt"), "utf8"), "hello\n");
  const before = await srv.git("readonly.git", "for-each-ref");
  await runGit(["commit", "--quiet", "--allow-empty", "-m", "refused"], { cwd: clone });
  for (const ref of ["refs/heads/main", "refs/git-csi/owner/v"]) {
    const push = await runGitRaw(["push", "origin", `HEAD:${ref}`], { cwd: clone, env });
    assert.notEqual(push.code, 0, `a push to ${ref} is refused`);
    assert.match(push.stderr, /this deploy key may only fetch/);
  }
  assert.equal(await srv.git("readonly.git", "for-each-ref"), before, "the remote's refs are unchanged");
  await runGit(["fetch", "--quiet", "origin"], { cwd: clone, env });
});

test("a revoked deploy key can no longer fetch; other keys still can", async () => {
  await srv.createRepo("revoke.git");
  const keep = await deployKey("keep");
  const temp = await deployKey("temp");
  assert.equal((await runGitRaw(["ls-remote", srv.url("revoke.git")], { env: sshEnv(temp) })).code, 0);

  await srv.revokeDeployKey("temp");
  const r = await runGitRaw(["ls-remote", srv.url("revoke.git")], { env: sshEnv(temp) });
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /Permission denied \(publickey\)/);
  assert.equal((await runGitRaw(["ls-remote", srv.url("revoke.git")], { env: sshEnv(keep) })).code, 0);
  await assert.rejects(srv.revokeDeployKey("temp"), /no deploy key/);
  await assert.rejects(srv.addDeployKey("keep"), /already exists/);
  await assert.rejects(srv.addDeployKey("../x"), /invalid deploy key name/);
});

test("the key runs git only: shell commands, ptys and forwarding are refused", async () => {
  const key = await deployKey("shell");
  const target = ["-p", String(srv.port), "root@127.0.0.1"];

  const id = await run("ssh", [...sshOpts(key), ...target, "id"]);
  assert.notEqual(id.code, 0);
  assert.match(id.stderr, /unrecognized command 'id'/);
  assert.doesNotMatch(id.stdout, /uid=/);

  const sh = await run("ssh", [...sshOpts(key), ...target, "sh", "-c", "'echo pwned'"]);
  assert.notEqual(sh.code, 0);
  assert.doesNotMatch(sh.stdout, /pwned/);

  const login = await run("ssh", [...sshOpts(key), "-tt", ...target]);
  assert.notEqual(login.code, 0);
  assert.match(login.stdout + login.stderr, /PTY allocation request failed/);
  const noCommand = await run("ssh", [...sshOpts(key), ...target]);
  assert.notEqual(noCommand.code, 0);
  assert.match(noCommand.stderr, /unrecognized command ''/);

  // stdio forwarding (-W) to the server's own port
  const fwd = await run("ssh", [...sshOpts(key), "-W", `127.0.0.1:${srv.port}`, ...target], 15_000);
  assert.notEqual(fwd.code, 0);
  assert.match(fwd.stderr, /administratively prohibited|forwarding disabled|open failed/i);
});

test("stop() kills sshd and open sessions, removes the temp dir", async () => {
  await srv.createRepo("held.git");
  const key = await deployKey("held");
  // an upload-pack session that stays open (it waits for our "want" lines)
  const client = spawn("ssh", [...sshOpts(key), "-p", String(srv.port), "root@127.0.0.1", `git-upload-pack '${srv.repoPath("held.git")}'`], {
    stdio: ["pipe", "pipe", "pipe"],
  });
  const clientClosed = new Promise<number | null>((r) => client.on("close", (code) => r(code)));
  await new Promise<void>((resolve, reject) => {
    client.stdout.once("data", () => resolve());
    client.once("close", () => reject(new Error("ssh client exited before the ref advertisement")));
  });

  const sessionPids = descendants(srv.pid);
  assert.ok(
    sessionPids.some((p) => /upload-pack/.test(cmdline(p))),
    `expected an upload-pack below sshd: ${sessionPids.map((p) => `${p}:${cmdline(p)}`).join(", ")}`,
  );
  const tmpRoot = path.dirname(srv.baseDir);
  const { pid, port } = srv;

  await srv.stop();
  await srv.stop(); // idempotent

  for (const p of [pid, ...sessionPids]) assert.equal(existsSync(`/proc/${p}`), false, `pid ${p} still exists`);
  assert.equal(existsSync(tmpRoot), false);
  const code = await Promise.race([clientClosed, new Promise<string>((r) => setTimeout(() => r("timeout"), 10_000).unref())]);
  assert.notEqual(code, "timeout", "ssh client connection was not closed");
  const refused = await new Promise<boolean>((r) => {
    const s = net.connect(port, "127.0.0.1");
    s.on("connect", () => (s.destroy(), r(false)));
    s.on("error", () => r(true));
  });
  assert.equal(refused, true, "port still accepts connections");
});
