import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import * as fsSync from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { test } from "node:test";
import { createLogger } from "@git-csi/logging";
import { collectGarbage, rememberSource } from "../src/trees/gc";
import { OwnerWatch, writeRecords } from "../src/lease/lease";
import { GitCommandError, gitIn, runGit, TCP_RELAY } from "../src/remote/git";
import { fetchBranch, pushUpdates } from "../src/remote/remote";
import { exists, upstreamRef } from "../src/trees/store";
import type { RemoteOptions } from "../src/remote/access";
import { revParse } from "../src/remote/tree";
import { freePort, gitAt, silentServer, stagedNode, tempDir } from "./remote";

const VOLUME = "pvc-transports";

const REFUSED_TRANSPORT = /transport '(file|ext|nohelper)' not allowed/;

test("git itself refuses a local path, file:// and helper transports in every git command the worker runs", async (t) => {
  const { store, access, remote } = await stagedNode(t, VOLUME);
  // What a volume of another tenant would name to read this one's repository, and the forge's own disk.
  const neighbour = store.repoDir(remote.url);
  const marker = path.join(store.stateDir, "ext-ran");
  const urls = [neighbour, `file://${neighbour}`, remote.dir, `file://${remote.dir}`, `ext::sh -c touch% ${marker}`, "nohelper::anything"];
  for (const url of urls) {
    await store.ensureRepo(url);
    await assert.rejects(
      access.run((options) => fetchBranch(store.repo(url, options), "main")),
      (err: Error) => REFUSED_TRANSPORT.test(err.message),
      `a fetch from ${url}`,
    );
  }
  // The volume's work tree and its scratch tree run git with the same settings.
  await fs.mkdir(store.scratchDir(VOLUME), { recursive: true });
  for (const [name, git] of [
    ["tree", store.tree(remote.url, VOLUME)],
    ["scratch", store.scratch(VOLUME)],
  ] as const) {
    await assert.rejects(git.raw(["ls-remote", `file://${neighbour}`]), REFUSED_TRANSPORT, `ls-remote in the ${name}`);
  }
  assert.equal(await exists(marker), false, "ext:: ran its command");
  // A user's configuration that allows file and ext, as many developers' does, changes nothing.
  const home = await tempDir(t, "home");
  await fs.writeFile(path.join(home, ".gitconfig"), '[protocol "file"]\n\tallow = always\n[protocol "ext"]\n\tallow = always\n');
  const ownHome = process.env.HOME;
  process.env.HOME = home;
  try {
    for (const url of [`file://${neighbour}`, `ext::sh -c touch% ${marker}`]) {
      await assert.rejects(
        access.run((options) => fetchBranch(store.repo(url, options), "main")),
        REFUSED_TRANSPORT,
        `with file and ext allowed in ~/.gitconfig, a fetch from ${url}`,
      );
    }
  } finally {
    process.env.HOME = ownHome;
  }
  assert.equal(await exists(marker), false, "ext:: ran its command");
  // The forge's transport still reaches the remote.
  remote.git("update-ref", "refs/heads/next", remote.git("rev-parse", "refs/heads/main"));
  assert.equal(await access.run((options) => fetchBranch(store.repo(remote.url, options), "next")), "fetched");
});

test("the store's collection passes over a source recorded before its ref was refused as a branch name", async (t) => {
  const { store, remote } = await stagedNode(t, VOLUME);
  // A node that took "--help" for a branch remembered the source of the stage that tried it.
  await rememberSource(store, "pvc-old", { url: remote.url, ref: "--help" });
  await collectGarbage(store, createLogger("git-worker", "error"), (_repoDir, work) => work(), { reach: () => undefined, ownerRefRetentionMs: 3_600_000, watch: new OwnerWatch() });
  assert.notEqual(await revParse(store.repo(remote.url), upstreamRef("main")), "", "the staged volume's branch was collected");
});

test("the store's collection deletes owner records a renewal replaced an hour ago, and keeps newer ones", async (t) => {
  const { store, remote } = await stagedNode(t, VOLUME);
  const repo = store.repo(remote.url);
  const record = (time: number) => ({ volumeId: VOLUME, node: "node-a", epoch: "e1", accessMode: "ReadWriteOnce" as const, time, expires: time + 90_000, released: false });
  const [replaced, recent] = await writeRecords(repo, [record(Date.now() - 7_200_000), record(Date.now())]);
  // Loose objects no ref names, as renewals leave them; the replaced one written two hours ago.
  const loose = path.join(store.repoDir(remote.url), "objects", replaced!.slice(0, 2), replaced!.slice(2));
  const twoHoursAgo = new Date(Date.now() - 7_200_000);
  await fs.utimes(loose, twoHoursAgo, twoHoursAgo);
  await collectGarbage(store, createLogger("git-worker", "error"), (_repoDir, work) => work(), { reach: () => undefined, ownerRefRetentionMs: 3_600_000, watch: new OwnerWatch() });
  assert.equal(await revParse(repo, replaced!), "", "the record replaced two hours ago is still in the node's repository");
  assert.equal(await revParse(repo, recent!), recent, "a record written now was deleted");
});

/** A commit on the empty history holding one file of `bytes` random bytes, written by the test's own git. */
function bigCommit(git: (...args: string[]) => string, gitDir: string, bytes: number): string {
  const file = path.join(path.dirname(gitDir), `random-${bytes}`);
  execFileSync("head", ["-c", String(bytes), "/dev/urandom"], { stdio: ["ignore", fsSync.openSync(file, "w"), "inherit"] });
  const blob = git("hash-object", "-w", file);
  const tree = execFileSync("git", ["mktree"], { env: { PATH: process.env.PATH, GIT_DIR: gitDir }, input: `100644 blob ${blob}\tdata\n`, encoding: "utf8" }).trim();
  return git("commit-tree", tree, "-m", "several MiB");
}

test("git:// goes through the worker's relay, which carries megabytes both ways and names a remote it cannot reach", async (t) => {
  const { store, access, remote } = await stagedNode(t, VOLUME);
  const trace = path.join(store.stateDir, "trace");
  // GIT_TRACE to a file: git logs every command it runs, the relay too.
  const traced = (options: RemoteOptions) => ({ ...options, env: { ...options.env, GIT_TRACE: trace } });
  const nodeDir = store.repoDir(remote.url);
  const sent = bigCommit(gitAt(nodeDir, store.stateDir), nodeDir, 6 << 20);
  const pushed = await access.run((options) => pushUpdates(store.repo(remote.url, traced(options)), [{ ref: "refs/heads/big", expected: "", next: sent }]));
  assert.deepEqual(pushed, { outcome: "pushed" });
  assert.equal(remote.git("rev-parse", "refs/heads/big"), sent);
  remote.git("fsck", "--no-dangling", "--connectivity-only", "refs/heads/big");

  const received = bigCommit(remote.git, remote.dir, 5 << 20);
  remote.git("update-ref", "refs/heads/big-upstream", received);
  assert.equal(await access.run((options) => fetchBranch(store.repo(remote.url, traced(options)), "big-upstream")), "fetched");
  assert.equal(await revParse(store.repo(remote.url), upstreamRef("big-upstream")), received);
  const port = new URL(remote.url).port;
  const relayed = (await fs.readFile(trace, "utf8")).split("\n").filter((line) => line.includes(`run_command: ${TCP_RELAY} 127.0.0.1 ${port}`));
  assert.equal(relayed.length, 2, "the push and the fetch each ran the relay");

  const gone = `git://127.0.0.1:${await freePort()}/gone.git`;
  await store.ensureRepo(gone);
  await assert.rejects(
    access.run((options) => fetchBranch(store.repo(gone, options), "main")),
    /git-csi-tcp-relay: cannot connect to 127\.0\.0\.1:\d+: Connection refused/,
  );
});

test("the relay ends once the git it serves is gone, though the server says nothing", async (t) => {
  const { port, connected } = await silentServer(t);
  const relay = spawn(TCP_RELAY, ["127.0.0.1", String(port)], { stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise<number | null>((resolve) => relay.once("exit", resolve));
  await connected;
  // git killed on a timeout: the end of the pipe it read from closes; it may never have closed its own writing end.
  relay.stdout.destroy();
  const code = await Promise.race([exited, sleep(10_000).then(() => "still running after 10 s")]);
  if (code === "still running after 10 s") relay.kill();
  assert.equal(code, 0);
});

/** A process's argv; none for one that ended meanwhile. */
function commandLine(pid: string): string[] {
  try {
    return fsSync.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
  } catch {
    return [];
  }
}

test("a git that a signal ended is a failure, never an empty answer", async (t) => {
  const { port, connected } = await silentServer(t);
  const url = `git://127.0.0.1:${port}/signalled-${process.pid}.git`;
  const dir = await tempDir(t, "signalled");
  // A hung remote: ls-remote waits for an answer until the test kills it, as the OOM killer or a SIGPIPE would.
  const answer = runGit(gitIn(dir, {}), ["ls-remote", url]).then(
    (output) => `answered ${JSON.stringify(output)}`,
    (err: Error) => err,
  );
  await connected;
  const git = (await fs.readdir("/proc")).find((pid) => /^\d+$/.test(pid) && commandLine(pid).includes(url));
  assert.ok(git, "the ls-remote's git runs");
  process.kill(Number(git), "SIGKILL");
  const failed = await answer;
  assert.ok(failed instanceof GitCommandError, `the killed git ${String(failed)}`);
  assert.match(failed.message, /ended by a signal/);
});
