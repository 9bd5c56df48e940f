import assert from "node:assert/strict";
import * as crypto from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { gitWorker } from "@git-csi/protos";
import { RemoteAccess } from "../src/remote/access";
import { CredentialBroker } from "../src/remote/broker";
import { LeaseLost, MountLease, type OnRemote, OwnerWatch } from "../src/lease/lease";
import { type Holder, type OwnerRecord, parseRecord, serveFor } from "../src/lease/ownership";
import { branchChange, type Fence, fetchBranch, pushCommit, type PushResult, STAGE_BYTES, stagingRef } from "../src/remote/remote";
import { renewTogether } from "../src/lease/renewal";
import { prepareTree } from "../src/trees/stage";
import { ownerRef, Store } from "../src/trees/store";
import { AUTHOR, recordCommit, type ServedRemote, servedRemote, tempDir } from "./remote";

/**
 * MountLease against a real remote: a bare repository served by git daemon
 * over git://, and nodes wired as service.ts and sync.ts wire them. These
 * tests show the remote's side of spec 000's fencing: a push whose owner-ref
 * lease is stale lands nothing, whatever the node's own view allowed.
 */

const LEASE_MS = 90_000;
const VOLUME = "pvc-lease";

interface Remote extends ServedRemote {
  /** The remote's refs under refs/, ref → oid. */
  refs: () => Map<string, string>;
  main: () => string;
  owner: () => string;
  record: () => OwnerRecord;
}

/** The forge's repository, as lease tests look at it. */
async function remoteRepo(t: TestContext): Promise<Remote> {
  const served = await servedRemote(t);
  const git = served.git;
  const refs = () => {
    const out = new Map<string, string>();
    for (const line of git("for-each-ref", "--format=%(refname) %(objectname)").split("\n").filter(Boolean)) {
      const [ref, oid] = line.split(" ");
      out.set(ref!, oid!);
    }
    return out;
  };
  const revParse = (ref: string) => {
    try {
      return git("rev-parse", "--verify", "--quiet", ref);
    } catch {
      return "";
    }
  };
  return {
    ...served,
    refs,
    main: () => revParse("refs/heads/main"),
    owner: () => revParse(ownerRef(VOLUME)),
    record: () => parseRecord(git("show", "-s", "--format=%B", ownerRef(VOLUME))),
  };
}

/** One node's git worker with the volume staged: its Store, work tree and the remote as sync.ts reaches it. */
interface Node {
  store: Store;
  remote: OnRemote;
  lease: (holder: Holder) => MountLease;
  /** Commits a change in the volume's work tree; the new HEAD. */
  commit: (file: string) => Promise<string>;
  /** A push of a commit to main, fenced by the lease, as sync.ts pushes. */
  push: (lease: MountLease, commit: string, capture?: (fence: Fence) => void) => Promise<PushResult>;
}

async function stagedNode(t: TestContext, name: string, remote: Remote): Promise<Node> {
  const stateDir = await tempDir(t, name);
  const store = new Store(stateDir);
  const source = { url: remote.url, ref: "main" };
  // No credential: the worker's RemoteAccess runs git with its own clean settings, as for a public remote.
  const access = await RemoteAccess.open(undefined, store.volumeDir(VOLUME), store.socketDir(), new CredentialBroker(path.join(stateDir, "broker.sock")));
  t.after(() => access.close());
  const viaAccess: OnRemote = (operation) => access.run((options) => operation(store.repo(source.url, options)));
  await prepareTree(store, VOLUME, source, access, false);
  const tree = store.tree(source.url, VOLUME, AUTHOR);
  // Each node is its own git worker: what it has watched of the owner ref is its own.
  const watch = new OwnerWatch();
  return {
    store,
    remote: viaAccess,
    lease: (holder) => new MountLease(holder, (env = {}) => store.repo(source.url, { config: [], env }), watch),
    commit: async (file) => {
      await fs.writeFile(path.join(store.treeDir(VOLUME), file), `${file}\n`);
      await tree.raw(["add", "--all"]);
      await tree.raw(["commit", "--quiet", "-m", `add ${file}`]);
      return (await tree.raw(["rev-parse", "HEAD"])).trim();
    },
    push: (lease, commit, capture) =>
      lease.fenced(
        viaAccess,
        (fence) => {
          capture?.(fence);
          return viaAccess((repo) => pushCommit(repo, commit, "main", fence));
        },
        [branchChange(commit, "main")],
      ),
  };
}

function holder(node: string, epoch: string, continues = false): Holder {
  return { volumeId: VOLUME, node, epoch, accessMode: "ReadWriteOnce", leaseMs: LEASE_MS, continues };
}

/** A record commit written straight into the remote: another node's claim this node has not seen. */
function foreignRecord(remote: Remote, record: OwnerRecord): string {
  return recordCommit(remote.dir, record);
}

/** Node A's record as a node whose wall clock is an hour behind B's writes it: by B's clock it ran out long ago. */
function recordAnHourBehind(remote: Remote, leaseMs: number): string {
  const time = Date.now() - 3_600_000;
  return foreignRecord(remote, { volumeId: VOLUME, node: "node-a", epoch: "ea", accessMode: "ReadWriteOnce", time, expires: time + leaseMs, released: false });
}

test("a taker takes a volume only once it has seen the owner ref on one record for a whole lease, whatever the record's times say", async (t) => {
  const remote = await remoteRepo(t);
  const b = await stagedNode(t, "node-b", remote);
  const leaseMs = 1500;
  remote.git("update-ref", ownerRef(VOLUME), recordAnHourBehind(remote, leaseMs));
  const taker = b.lease({ ...holder("node-b", "eb"), leaseMs });

  const first = await taker.claim(b.remote);
  assert.equal(first.held, false);
  assert.equal(first.refusal, gitWorker.LeaseRefusal.LEASE_REFUSAL_TAKEN);
  assert.match(first.message, /held by node node-a.*unchanged for a whole lease \(2 s\)/);
  // A renews before B's watch is over: B watches the new record from the start.
  await sleep((leaseMs * 2) / 3);
  remote.git("update-ref", ownerRef(VOLUME), recordAnHourBehind(remote, leaseMs));
  await sleep((leaseMs * 2) / 3);
  assert.equal((await taker.claim(b.remote)).held, false, "a lease since B's first look, but not since A's renewal");
  assert.equal(remote.record().epoch, "ea");
  // A renews no more: a lease after B first saw its last record, B takes the volume.
  await sleep(leaseMs);
  assert.equal((await taker.claim(b.remote)).held, true);
  assert.equal(remote.record().epoch, "eb");
});

test("the mount serves from when its renewal was sent, by the node's own clock: a record time an hour ahead lengthens nothing", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  // The volume was released by a node whose clock runs an hour ahead: its record's time is the floor of the next one's.
  const ahead = Date.now() + 3_600_000;
  remote.git("update-ref", ownerRef(VOLUME), foreignRecord(remote, { volumeId: VOLUME, node: "node-c", epoch: "ec", accessMode: "ReadWriteOnce", time: ahead, expires: ahead, released: true }));
  const lease = a.lease(holder("node-a", "ea"));
  const before = Date.now();
  const claimed = await lease.claim(a.remote);
  const after = Date.now();
  assert.equal(claimed.held, true);
  assert.equal(remote.record().time, ahead + 1, "the record's time, for people, never goes back");
  const until = Number(claimed.serveUntilUnixMs);
  assert.ok(until >= before + serveFor(LEASE_MS) && until <= after + serveFor(LEASE_MS), `serves until ${until - after} ms from now`);
  // Each renewal is a new commit though the clock is behind the records: the ref moves, and a taker's watch starts again.
  const first = remote.owner();
  assert.equal((await lease.claim(a.remote)).held, true);
  assert.notEqual(remote.owner(), first);
  assert.equal(remote.record().time, ahead + 2);
});

test("the remote refuses a push whose owner-ref lease went stale: nothing of it lands", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  const lease = a.lease(holder("node-a", "ea"));
  const first = remote.main();

  assert.equal((await lease.claim(a.remote)).held, true);
  assert.equal(remote.record().epoch, "ea");

  // While A holds the volume, its fenced push lands together with the renewal.
  const c1 = await a.commit("one");
  assert.deepEqual(await a.push(lease, c1), { outcome: "pushed" });
  assert.equal(remote.main(), c1);
  assert.notEqual(remote.main(), first);
  const renewal = remote.record();
  assert.equal(renewal.epoch, "ea");

  // Node B's claim lands on the remote; A has not seen it, so its own view still lets it renew.
  const now = Date.now();
  const b = foreignRecord(remote, { volumeId: VOLUME, node: "node-b", epoch: "eb", accessMode: "ReadWriteOnce", time: now, expires: now + LEASE_MS, released: false });
  remote.git("update-ref", ownerRef(VOLUME), b);
  const before = remote.refs();

  const c2 = await a.commit("two");
  await assert.rejects(a.push(lease, c2), (err: unknown) => err instanceof LeaseLost && /taken over by node node-b/.test(err.message));

  // Atomic: main did not take A's commit, although main's own lease (c1) still held; the owner ref is B's.
  assert.equal(remote.main(), c1);
  assert.equal(remote.owner(), b);
  assert.deepEqual(remote.refs(), before);

  const state = lease.state();
  assert.equal(state.held, false);
  assert.equal(state.refusal, gitWorker.LeaseRefusal.LEASE_REFUSAL_SUPERSEDED);
  // The lost epoch stays lost: nothing more is pushed or claimed.
  await assert.rejects(a.push(lease, c2), LeaseLost);
  assert.equal((await lease.claim(a.remote)).held, false);
  assert.deepEqual(remote.refs(), before);
});

test("a released epoch pushes nothing: the lease refuses it, and so does the remote for its last fence", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  const lease = a.lease(holder("node-a", "ea"));
  assert.equal((await lease.claim(a.remote)).held, true);

  const fences: Fence[] = [];
  const c1 = await a.commit("one");
  assert.deepEqual(await a.push(lease, c1, (fence) => fences.push(fence)), { outcome: "pushed" });
  const lastFence = fences.at(-1)![0]!;
  assert.equal(remote.owner(), lastFence.next);

  assert.equal(await lease.release(a.remote), true);
  const released = remote.record();
  assert.equal(released.epoch, "ea");
  assert.equal(released.released, true);
  const before = remote.refs();

  const c2 = await a.commit("two");
  await assert.rejects(a.push(lease, c2), (err: unknown) => err instanceof LeaseLost && err.message === "released");
  assert.equal(lease.state().held, false);
  assert.deepEqual(remote.refs(), before);

  // The remote's side: a push carrying the fence the epoch last held, renewed from the record it wrote
  // before the release. The release moved the owner ref, so the atomic push is rejected whole.
  const now = Date.now();
  const renewal = recordCommit(a.store.repoDir(remote.url), { volumeId: VOLUME, node: "node-a", epoch: "ea", accessMode: "ReadWriteOnce", time: now, expires: now + LEASE_MS, released: false });
  const stale: Fence = [{ ...lastFence, expected: lastFence.next, next: renewal }];
  const result = await a.remote((repo) => pushCommit(repo, c2, "main", stale));
  assert.equal(result.outcome, "rejected");
  assert.deepEqual(remote.refs(), before);
  assert.equal(remote.main(), c1);
  assert.equal(remote.record().released, true);
});

test("a restarted worker's epoch continues while the record names it, and is superseded once another epoch took the volume", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  const b = await stagedNode(t, "node-b", remote);

  const original = a.lease(holder("node-a", "ea"));
  assert.equal((await original.claim(a.remote)).held, true);

  // The worker restarted: a new MountLease for the same epoch, which may have served already.
  const restarted = a.lease(holder("node-a", "ea", true));
  const continued = await restarted.claim(a.remote);
  assert.equal(continued.held, true);
  assert.equal(remote.record().epoch, "ea");
  const c1 = await a.commit("one");
  assert.deepEqual(await a.push(restarted, c1), { outcome: "pushed" });
  assert.equal(remote.main(), c1);

  // The epoch ends; node B's epoch takes the volume, pushes, and releases it.
  assert.equal(await restarted.release(a.remote), true);
  const eb = b.lease(holder("node-b", "eb"));
  assert.equal((await eb.claim(b.remote)).held, true);
  assert.equal(remote.record().epoch, "eb");
  await b.remote((repo) => fetchBranch(repo, "main"));
  await b.store.tree(remote.url, VOLUME, AUTHOR).raw(["reset", "--quiet", "--hard", "refs/git-csi/upstream/heads/main"]);
  const cb = await b.commit("from-b");
  assert.deepEqual(await b.push(eb, cb), { outcome: "pushed" });
  assert.equal(await eb.release(b.remote), true);
  const recordB = remote.record();
  assert.equal(recordB.epoch, "eb");
  assert.equal(recordB.released, true);
  const before = remote.refs();

  // Worker A restarts again: the volume is free, but this epoch may have served, so it never comes back.
  const again = a.lease(holder("node-a", "ea", true));
  const refused = await again.claim(a.remote);
  assert.equal(refused.held, false);
  assert.equal(refused.refusal, gitWorker.LeaseRefusal.LEASE_REFUSAL_SUPERSEDED);
  const c2 = await a.commit("two");
  await assert.rejects(a.push(again, c2), LeaseLost);
  assert.deepEqual(remote.refs(), before);
  assert.equal(remote.main(), cb);
});

/** Polls `probe` until it holds: the test waits for a condition, never for a guessed time. */
async function until(what: string, probe: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!probe()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

test("a restarted worker serves no longer than the mount owner says its mount may: once that time is over the epoch is expired, never renewed, and pushes nothing", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  assert.equal((await a.lease(holder("node-a", "ea")).claim(a.remote)).held, true);
  const c1 = await a.commit("one");

  // The worker restarted; the mount owner hands it the epoch with 300 ms of serving time left.
  const restarted = a.lease(holder("node-a", "ea", true));
  restarted.servesAtMost(300);
  assert.equal(restarted.state().refusal, gitWorker.LeaseRefusal.LEASE_REFUSAL_NONE, "it serves on the mount owner's word until then");
  await until("the mount owner's serving time to be over", () => restarted.state().refusal === gitWorker.LeaseRefusal.LEASE_REFUSAL_EXPIRED);
  const before = remote.refs();

  // The record still names the epoch and no taker claimed: only the serving time tells it is dead.
  assert.equal(remote.record().epoch, "ea");
  const claimed = await restarted.claim(a.remote);
  assert.equal(claimed.held, false);
  assert.equal(claimed.refusal, gitWorker.LeaseRefusal.LEASE_REFUSAL_EXPIRED);
  assert.match(claimed.message, /ran out unrenewed/);
  assert.doesNotMatch(claimed.message, /\bea\b/, "the epoch is never in a message");
  assert.deepEqual(remote.refs(), before, "the expired epoch was not renewed");
  await assert.rejects(a.push(restarted, c1), LeaseLost);
  assert.deepEqual(remote.refs(), before, "nothing of the expired epoch's commit landed");
});

test("a mount owner whose mount has no serving time left hands over an expired epoch; one that cannot tell (0) leaves the claim as it was", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  assert.equal((await a.lease(holder("node-a", "ea")).claim(a.remote)).held, true);
  const before = remote.refs();

  const over = a.lease(holder("node-a", "ea", true));
  over.servesAtMost(-1);
  const refused = await over.claim(a.remote);
  assert.equal(refused.held, false);
  assert.equal(refused.refusal, gitWorker.LeaseRefusal.LEASE_REFUSAL_EXPIRED);
  assert.deepEqual(remote.refs(), before, "no renewal was written");

  const unknown = a.lease(holder("node-a", "ea", true));
  unknown.servesAtMost(0);
  assert.equal((await unknown.claim(a.remote)).held, true, "a mount owner that restarted knows no serving time: the epoch continues as it did");
  assert.notEqual(remote.owner(), before.get(ownerRef(VOLUME)));
});

test("the worker never believes the mount may serve longer than the mount owner says: a shorter word shortens its serving time, a longer one lengthens nothing", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  const lease = a.lease(holder("node-a", "ea"));
  const asked = Date.now();
  assert.equal((await lease.claim(a.remote)).held, true);
  const renewed = Number(lease.state().serveUntilUnixMs);
  assert.ok(renewed >= asked + serveFor(LEASE_MS) - 1_000, "the claim's renewal serves nine tenths of the lease");

  lease.servesAtMost(10 * LEASE_MS);
  assert.ok(Number(lease.state().serveUntilUnixMs) <= renewed + 1, "a longer word lengthens nothing");
  const told = Date.now();
  lease.servesAtMost(2_000);
  const state = lease.state();
  assert.equal(state.held, true);
  assert.ok(Number(state.serveUntilUnixMs) <= Date.now() + 2_000 && Number(state.serveUntilUnixMs) >= told + 2_000 - 1, `serves until ${Number(state.serveUntilUnixMs) - told} ms after the word`);
});

test("a push with much to send sends it ahead outside the lease: a renewal during the transfer lands, and the fenced push only moves refs", async (t) => {
  const remote = await remoteRepo(t);
  const a = await stagedNode(t, "node-a", remote);
  const lease = a.lease(holder("node-a", "ea"));
  assert.equal((await lease.claim(a.remote)).held, true);
  // The remote logs each push's refs; a push that brings over a MiB takes it 3 s, a transfer longer than the renewal's wait.
  const log = path.join(path.dirname(remote.dir), "pushes.log");
  const hook = `#!/bin/sh\nawk '{printf "%s ", $3} END {print ""}' >> '${log}'\n[ "$(du -sk "$GIT_QUARANTINE_PATH" | cut -f1)" -gt 1024 ] && sleep 3\nexit 0\n`;
  await fs.writeFile(path.join(remote.dir, "hooks", "pre-receive"), hook, { mode: 0o755 });
  const pushes = async () =>
    (await fs.readFile(log, "utf8").catch(() => ""))
      .split("\n")
      .filter(Boolean)
      .map((l) => l.trim().split(" "));
  await fs.writeFile(path.join(a.store.treeDir(VOLUME), "large.bin"), crypto.randomBytes(2 * STAGE_BYTES));
  const large = await a.commit("small");
  const first = remote.main();

  const pushing = a.push(lease, large);
  while ((await pushes()).length === 0) await sleep(50);
  const ownerBefore = remote.owner();
  const started = Date.now();
  await renewTogether([lease], a.remote, a.store.repo(remote.url), 1_000);
  assert.ok(Date.now() - started < 3_000, "the renewal did not wait for the transfer");
  assert.notEqual(remote.owner(), ownerBefore, "the renewal landed during the transfer");
  assert.equal(remote.main(), first, "main has not moved yet");

  assert.deepEqual(await pushing, { outcome: "pushed" });
  assert.equal(remote.main(), large);
  assert.equal(remote.record().epoch, "ea");
  const received = (await pushes()).map((refs) => refs.sort());
  assert.deepEqual(received, [[stagingRef(VOLUME, 0)], [ownerRef(VOLUME)], [ownerRef(VOLUME), stagingRef(VOLUME, 0), "refs/heads/main"]]);
  assert.ok(![...remote.refs().keys()].some((ref) => ref.startsWith("refs/git-csi/staging/")), "the fenced push deleted the staging ref");
});
