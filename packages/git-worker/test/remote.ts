import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import type { TestContext } from "node:test";
import { RemoteAccess } from "../src/remote/access";
import { KeyedSerial } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import { DriverMetrics } from "@git-csi/metrics";
import { CredentialBroker } from "../src/remote/broker";
import type { GitWorkerDeps } from "../src/service";
import { rememberSource } from "../src/trees/gc";
import { type OnRemote, OwnerWatch } from "../src/lease/lease";
import { formatRecord, type OwnerRecord } from "../src/lease/ownership";
import { prepareTree } from "../src/trees/stage";
import { Store } from "../src/trees/store";

export const AUTHOR = { GIT_AUTHOR_NAME: "app", GIT_AUTHOR_EMAIL: "app@localhost", GIT_COMMITTER_NAME: "app", GIT_COMMITTER_EMAIL: "app@localhost" };

export async function tempDir(t: TestContext, name: string): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), `git-worker-test-${name}-`));
  t.after(() => fs.rm(dir, { recursive: true, force: true }));
  return dir;
}

/** git in a repository, synchronously, outside the worker: the test's own view of it. */
export function gitAt(gitDir: string, home: string): (...args: string[]) => string {
  return (...args) => execFileSync("git", args, { env: { PATH: process.env.PATH, HOME: home, GIT_DIR: gitDir, ...AUTHOR }, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }).trim();
}

/**
 * A real git daemon serving every repository under a directory over git://
 * on 127.0.0.1, as a forge serves them: the worker refuses to reach a remote
 * through the file system. Each connection gets its own `git daemon --inetd`
 * holding the socket, so the port is the kernel's choice and never races.
 */
async function serveGitDaemon(t: TestContext, baseDir: string): Promise<(repo: string) => string> {
  const children = new Set<ChildProcess>();
  // Paused: not one byte of a connection is read here; the daemon reads it all.
  const server = net.createServer({ pauseOnConnect: true }, (socket) => {
    const child = spawn("git", ["daemon", "--inetd", "--export-all", "--enable=receive-pack", `--base-path=${baseDir}`, baseDir], {
      stdio: [socket, socket, "ignore"],
      env: { PATH: process.env.PATH, HOME: baseDir, GIT_CONFIG_NOSYSTEM: "1" },
    });
    children.add(child);
    child.once("exit", () => children.delete(child));
    socket.destroy();
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  t.after(async () => {
    for (const child of children) child.kill();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const { port } = server.address() as net.AddressInfo;
  return (repo) => `git://127.0.0.1:${port}/${repo}`;
}

/** A port nothing listens on: the kernel's choice, let go at once. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A TCP server that accepts and never says a word, as a hung remote; its port, and a promise of its first connection. */
export async function silentServer(t: TestContext): Promise<{ port: number; connected: Promise<void> }> {
  const sockets: net.Socket[] = [];
  const server = net.createServer((socket) => sockets.push(socket));
  const connected = new Promise<void>((resolve) => server.once("connection", () => resolve()));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    for (const socket of sockets) socket.destroy();
    server.close();
  });
  return { port: (server.address() as net.AddressInfo).port, connected };
}

export interface ServedRemote {
  /** The bare repository on disk. */
  dir: string;
  /** Its git:// URL. */
  url: string;
  git: (...args: string[]) => string;
}

/** A bare repository with one commit on main, as a forge would hold and serve it. */
export async function servedRemote(t: TestContext): Promise<ServedRemote> {
  const base = await tempDir(t, "remote");
  const dir = path.join(base, "remote.git");
  execFileSync("git", ["init", "--bare", "--quiet", dir], { env: { PATH: process.env.PATH, HOME: base } });
  const git = gitAt(dir, base);
  git("symbolic-ref", "HEAD", "refs/heads/main");
  const blob = execFileSync("git", ["hash-object", "-w", "--stdin"], { env: { PATH: process.env.PATH, HOME: base, GIT_DIR: dir }, input: "hello\n", encoding: "utf8" }).trim();
  const tree = execFileSync("git", ["mktree"], { env: { PATH: process.env.PATH, HOME: base, GIT_DIR: dir }, input: `100644 blob ${blob}\tREADME\n`, encoding: "utf8" }).trim();
  git("update-ref", "refs/heads/main", git("commit-tree", tree, "-m", "first"));
  const url = (await serveGitDaemon(t, base))("remote.git");
  return { dir, url, git };
}

/** A node's git store with one volume staged from a forge: its state directory holds that volume's repository. */
export interface StagedNode {
  store: Store;
  access: RemoteAccess;
  remote: ServedRemote;
  /** A git command against the remote, as the worker runs it for the volume. */
  onRemote: OnRemote;
  /** What the node's git worker watched of the owner refs: its claims' and its collections' one watch. */
  watch: OwnerWatch;
}

/** Stages a volume as the worker's prepare_tree does: the source first, then the tree. A new forge unless one is given. */
export async function stagedNode(t: TestContext, volumeId: string, served?: ServedRemote): Promise<StagedNode> {
  const remote = served ?? (await servedRemote(t));
  const stateDir = await tempDir(t, "node");
  const store = new Store(stateDir);
  const access = await RemoteAccess.open(undefined, store.volumeDir(volumeId), store.socketDir(), new CredentialBroker(path.join(stateDir, "broker.sock")));
  t.after(() => access.close());
  await stageAnother(store, access, remote.url, volumeId);
  return { store, access, remote, onRemote: (operation) => access.run((options) => operation(store.repo(remote.url, options))), watch: new OwnerWatch() };
}

/** One more volume of the URL staged on the node. */
export async function stageAnother(store: Store, access: RemoteAccess, url: string, volumeId: string): Promise<void> {
  const source = { url, ref: "main" };
  await rememberSource(store, volumeId, source);
  await prepareTree(store, volumeId, source, access, false);
}

/** An owner record commit in a repository, as MountLease writes one. */
export function recordCommit(gitDir: string, record: OwnerRecord): string {
  const git = gitAt(gitDir, os.tmpdir());
  return git("commit-tree", git("hash-object", "-t", "tree", "-w", "/dev/null"), "-m", formatRecord(record));
}

/** A worker's dependencies on a node's state directory, with nothing but git behind them: no mount serves a tree, no collection is asked for. */
export function workerDeps(stateDir: string, logger: Logger): GitWorkerDeps {
  return {
    store: new Store(stateDir),
    syncs: new Map(),
    readers: new Map(),
    unstaging: new Set(),
    broker: new CredentialBroker(path.join(stateDir, "broker.sock")),
    metrics: new DriverMetrics(),
    logger,
    perRepository: new KeyedSerial(),
    collect: async () => undefined,
    syncMount: async () => false,
    invalidateMount: async () => false,
  };
}
