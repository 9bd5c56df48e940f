import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { METADATA_REF } from "@git-csi/config";
import { createLogger } from "@git-csi/logging";
import type { CollectionPolicy } from "../src/trees/collect-remote";
import { collectGarbage, removeTree } from "../src/trees/gc";
import { MountLease, type OnRemote, OwnerWatch } from "../src/lease/lease";
import { checkoutReader, readerKeyOfSource, readerMetadataRef, readerRef, releaseReader } from "../src/trees/reader";
import type { OwnerRecord } from "../src/lease/ownership";
import { stagingRef } from "../src/remote/remote";
import { volumeBranchRef } from "../src/trees/stage";
import { exists, ownerRef, strandedRef, upstreamOwnerRef } from "../src/trees/store";
import { rememberStage } from "../src/trees/strand-kept";
import { revParse } from "../src/remote/tree";
import { runGit } from "../src/remote/git";
import { AUTHOR, recordCommit, type ServedRemote, servedRemote, stageAnother, type StagedNode, stagedNode, tempDir, workerDeps } from "./remote";

/**
 * The collection of the driver's refs against a real forge: a bare
 * repository served by git daemon, nodes that stage, claim and release as the
 * worker does, and collectGarbage as the worker's hourly timer runs it.
 */

const HOUR = 3_600_000;
const LEASE_MS = 90_000;

/** The collection's log lines, as JSON objects. */
type Line = Record<string, unknown>;

function quietLogger(): { logger: ReturnType<typeof createLogger>; lines: Line[] } {
  const logger = createLogger("git-worker", "info");
  logger.transports[0]!.silent = true;
  const lines: Line[] = [];
  logger.on("data", (line: Line) => lines.push(line));
  return { logger, lines };
}

/** A mount epoch's lease of a volume on a node, as claim_mount makes it, on the node's watch. */
function leaseOn(node: StagedNode, nodeName: string, volumeId: string, epoch: string): MountLease {
  const holder = { volumeId, node: nodeName, epoch, accessMode: "ReadWriteOncePod" as const, leaseMs: LEASE_MS, continues: false };
  return new MountLease(holder, (env = {}) => node.store.repo(node.remote.url, { config: [], env }), node.watch);
}

/** Runs the collection on a node that reaches the remote through its volume, serving these epochs. */
async function collect(node: StagedNode, served: Record<string, string>, retentionMs = HOUR): Promise<Line[]> {
  const { logger, lines } = quietLogger();
  const policy: CollectionPolicy = { reach: () => ({ remote: node.onRemote, served: new Map(Object.entries(served)) }), ownerRefRetentionMs: retentionMs, watch: node.watch };
  await collectGarbage(node.store, logger, (_repoDir, work) => work(), policy);
  return lines;
}

/** The forge's refs under a prefix. */
function remoteRefs(remote: ServedRemote, prefix: string): string[] {
  return remote.git("for-each-ref", "--format=%(refname)", prefix).split("\n").filter(Boolean).sort();
}

/** An owner record written straight into the forge, as a node's lease wrote it at that time. */
function recordOnRemote(remote: ServedRemote, record: Omit<OwnerRecord, "accessMode" | "node">): void {
  remote.git("update-ref", ownerRef(record.volumeId), recordCommit(remote.dir, { ...record, node: "node-z", accessMode: "ReadWriteOncePod" }));
}

/** A record of node-z, whose wall clock runs an hour behind the collector's: by the collector's clock, its lease ran out an hour ago. */
function recordAnHourBehind(remote: ServedRemote, volumeId: string, epoch: string, leaseMs: number, released = false): void {
  const time = Date.now() - HOUR;
  recordOnRemote(remote, { volumeId, epoch, time, expires: released ? time : time + leaseMs, released });
}

function deletionLogged(lines: Line[], volumeId: string, ref: string): boolean {
  return lines.some((l) => l.volume === volumeId && l.operation === "gc" && l.ref === ref && String(l.message).startsWith(`deleted ${ref} on the remote`));
}

test("staging refs no push uses go at the next collection; those a live epoch on another node may still use stay", async (t: TestContext) => {
  const a = await stagedNode(t, "pvc-here");
  const b = await stagedNode(t, "pvc-elsewhere", a.remote);
  await stageAnother(b.store, b.access, b.remote.url, "pvc-released");
  assert.equal((await leaseOn(a, "node-a", "pvc-here", "e-here").claim(a.onRemote)).held, true);
  assert.equal((await leaseOn(b, "node-b", "pvc-elsewhere", "e-b").claim(b.onRemote)).held, true);
  const released = leaseOn(b, "node-b", "pvc-released", "e-r");
  assert.equal((await released.claim(b.onRemote)).held, true);
  assert.equal(await released.release(b.onRemote), true);
  // Objects sent ahead by pushes that never got to their fenced update; pvc-crashed was never claimed.
  const main = a.remote.git("rev-parse", "refs/heads/main");
  const staging = ["pvc-here", "pvc-elsewhere", "pvc-released", "pvc-crashed"].map((v) => stagingRef(v, 0)).concat(stagingRef("pvc-elsewhere", 1));
  for (const ref of staging) a.remote.git("update-ref", ref, main);

  const lines = await collect(a, { "pvc-here": "e-here" });

  assert.deepEqual(remoteRefs(a.remote, "refs/git-csi/staging/"), [stagingRef("pvc-elsewhere", 0), stagingRef("pvc-elsewhere", 1)], "only the live epoch's on node-b stay");
  for (const v of ["pvc-here", "pvc-released", "pvc-crashed"]) assert.ok(deletionLogged(lines, v, stagingRef(v, 0)), `the deletion of ${v}'s staging ref is logged`);
  assert.deepEqual(remoteRefs(a.remote, "refs/git-csi/owner/"), ["pvc-elsewhere", "pvc-here", "pvc-released"].map(ownerRef), "no owner ref is past the retention");
});

test("an owner ref goes once this node watched it unchanged for the retention after no epoch held it, or once its volume was deleted; a live epoch's stays", async (t: TestContext) => {
  const a = await stagedNode(t, "pvc-a");
  const b = await stagedNode(t, "pvc-b", a.remote);
  const remote = a.remote;
  const retentionMs = 400;
  const shortLeaseMs = 200;
  assert.equal((await leaseOn(a, "node-a", "pvc-a", "e-a").claim(a.onRemote)).held, true);
  assert.equal((await leaseOn(b, "node-b", "pvc-b", "e-b").claim(b.onRemote)).held, true);
  // Written by a clock an hour behind: by their times both are past the retention, and neither is to this node yet.
  recordAnHourBehind(remote, "pvc-old-released", "e1", shortLeaseMs, true);
  recordAnHourBehind(remote, "pvc-old-expired", "e2", shortLeaseMs);
  // Deleted here: staged, released and its tree removed. pvc-again's was removed while node-b holds it.
  await stageAnother(a.store, a.access, remote.url, "pvc-deleted");
  const lease = leaseOn(a, "node-a", "pvc-deleted", "e-deleted");
  assert.equal((await lease.claim(a.onRemote)).held, true);
  assert.equal(await lease.release(a.onRemote), true);
  await stageAnother(a.store, a.access, remote.url, "pvc-again");
  for (const volumeId of ["pvc-deleted", "pvc-again"]) await removeTree(a.store, volumeId, { url: remote.url, ref: "main" }, quietLogger().logger);
  assert.equal((await leaseOn(b, "node-b", "pvc-again", "e-again-b").claim(b.onRemote)).held, true);

  const first = await collect(a, { "pvc-a": "e-a" }, retentionMs);
  assert.ok(deletionLogged(first, "pvc-deleted", ownerRef("pvc-deleted")), "the deleted volume's released record goes at once");
  assert.deepEqual(remoteRefs(remote, "refs/git-csi/owner/"), ["pvc-a", "pvc-again", "pvc-b", "pvc-old-expired", "pvc-old-released"].map(ownerRef));
  // Staged again and released since the collection noted pvc-again's owner ref, by a clock an hour behind the deletion's.
  recordAnHourBehind(remote, "pvc-again", "e-again-c", shortLeaseMs, true);
  await sleep(shortLeaseMs + retentionMs);
  recordAnHourBehind(remote, "pvc-recent", "e3", shortLeaseMs, true);

  const lines = await collect(a, { "pvc-a": "e-a" }, retentionMs);

  assert.deepEqual(remoteRefs(remote, "refs/git-csi/owner/"), ["pvc-a", "pvc-again", "pvc-b", "pvc-recent"].map(ownerRef));
  for (const v of ["pvc-old-released", "pvc-old-expired"]) assert.ok(deletionLogged(lines, v, ownerRef(v)), `the deletion of ${v}'s owner ref is logged`);
  assert.deepEqual(await fs.readdir(path.join(a.store.stateDir, "deleted-owner-refs")), [], "both deletions are settled: one ref went, the other volume was staged again");
});

test("a live epoch's staging refs and owner ref stay whatever its record's times say, until this node watched the owner ref unchanged for a lease, and the retention", async (t: TestContext) => {
  const a = await stagedNode(t, "pvc-a");
  const remote = a.remote;
  const leaseMs = 600;
  // Longer than a collection on a busy machine: the owner ref outlives the staging ref by at least one.
  const retentionMs = 2000;
  // node-z, its clock an hour behind, holds pvc-z and has sent a push's objects ahead.
  recordAnHourBehind(remote, "pvc-z", "e-z", leaseMs);
  remote.git("update-ref", stagingRef("pvc-z", 0), remote.git("rev-parse", "refs/heads/main"));
  const kept = () => remoteRefs(remote, "refs/git-csi/").filter((r) => r.includes("pvc-z"));
  const both = [ownerRef("pvc-z"), stagingRef("pvc-z", 0)];

  await collect(a, {}, retentionMs);
  assert.deepEqual(kept(), both, "first seen: the epoch may hold the volume");
  // node-z renews before a lease is over: the watch starts again.
  await sleep((leaseMs * 2) / 3);
  recordAnHourBehind(remote, "pvc-z", "e-z", leaseMs);
  await sleep((leaseMs * 2) / 3);
  await collect(a, {}, retentionMs);
  assert.deepEqual(kept(), both, "a lease since the first look, but not since the renewal");
  // node-z renews no more.
  await sleep(leaseMs);
  const lines = await collect(a, {}, retentionMs);
  assert.deepEqual(kept(), [ownerRef("pvc-z")], "watched unchanged for a lease: no push of the epoch uses the staging ref");
  assert.ok(deletionLogged(lines, "pvc-z", stagingRef("pvc-z", 0)));
  await sleep(retentionMs);
  assert.ok(deletionLogged(await collect(a, {}, retentionMs), "pvc-z", ownerRef("pvc-z")), "and for the retention after: the owner ref goes");
  assert.deepEqual(kept(), []);
});

test("a live epoch's owner ref stays whatever the retention, and though a node deleted the volume before it renewed", async (t: TestContext) => {
  const a = await stagedNode(t, "pvc-a");
  const b = await stagedNode(t, "pvc-live", a.remote);
  const remote = a.remote;
  const live = leaseOn(b, "node-b", "pvc-live", "e-live");
  assert.equal((await live.claim(b.onRemote)).held, true);
  const released = leaseOn(b, "node-b", "pvc-done", "e-done");
  assert.equal((await released.claim(b.onRemote)).held, true);
  assert.equal(await released.release(b.onRemote), true);
  // Node a removed pvc-stale's tree after node-z's epoch last renewed, and that lease still runs.
  await stageAnother(a.store, a.access, remote.url, "pvc-stale");
  const renewed = Date.now() - 1_000;
  await removeTree(a.store, "pvc-stale", { url: remote.url, ref: "main" }, quietLogger().logger);
  recordOnRemote(remote, { volumeId: "pvc-stale", epoch: "e-z", time: renewed, expires: renewed + LEASE_MS, released: false });
  await sleep(5);

  // A retention of 1 ms, shorter than the live records' age, and a second look past it: only a lease's end counts.
  await collect(a, {}, 1);
  await sleep(5);
  const lines = await collect(a, {}, 1);

  assert.deepEqual(remoteRefs(remote, "refs/git-csi/owner/"), [ownerRef("pvc-live"), ownerRef("pvc-stale")]);
  assert.ok(deletionLogged(lines, "pvc-done", ownerRef("pvc-done")), "the released record went: the collection ran");
});

test("a claim that lands between the collection's read and its deletion wins: the owner ref keeps the claim", async (t: TestContext) => {
  const a = await stagedNode(t, "pvc-a");
  const b = await stagedNode(t, "pvc-race", a.remote);
  const remote = a.remote;
  const first = leaseOn(b, "node-b", "pvc-race", "e-first");
  assert.equal((await first.claim(b.onRemote)).held, true);
  assert.equal(await first.release(b.onRemote), true);
  // The collection reaches the remote twice, to read the refs and to delete; node-c's claim lands in between.
  const racing = leaseOn(b, "node-c", "pvc-race", "e-race");
  let reached = 0;
  const remoteAfterRead: OnRemote = async (operation) => {
    if (++reached === 2) assert.equal((await racing.claim(b.onRemote)).held, true, "the claim of the released volume lands");
    return a.onRemote(operation);
  };
  const { logger, lines } = quietLogger();
  // No retention: the released record is past it at once.
  await collectGarbage(a.store, logger, (_repoDir, work) => work(), { reach: () => ({ remote: remoteAfterRead, served: new Map() }), ownerRefRetentionMs: 0, watch: a.watch });

  assert.equal(reached, 2);
  assert.match(remote.git("show", "-s", "--format=%B", ownerRef("pvc-race")), /^epoch: e-race$/m, "the owner ref holds the claim");
  assert.ok(lines.some((l) => l.volume === "pvc-race" && l.message === `kept ${ownerRef("pvc-race")}: it moved since the collection read it`));
});

test("the node's views of a removed volume go, with what a removal cut short left; a kept tree's stay", async (t: TestContext) => {
  const a = await stagedNode(t, "pvc-keep");
  const repo = a.store.repo(a.remote.url);
  await stageAnother(a.store, a.access, a.remote.url, "pvc-gone");
  await stageAnother(a.store, a.access, a.remote.url, "pvc-cut");
  for (const v of ["pvc-keep", "pvc-gone", "pvc-cut"]) {
    // Two stages of the volume on the node: the second reads the first one's record, into the node's view.
    for (const epoch of ["e1", "e2"]) {
      const lease = leaseOn(a, "node-a", v, epoch);
      assert.equal((await lease.claim(a.onRemote)).held, true);
      if (v !== "pvc-keep" || epoch === "e1") assert.equal(await lease.release(a.onRemote), true);
    }
    assert.notEqual(await revParse(repo, upstreamOwnerRef(v)), "", `the second claim left the node a view of ${v}'s owner ref`);
  }
  const { logger, lines } = quietLogger();
  await removeTree(a.store, "pvc-gone", { url: a.remote.url, ref: "main" }, logger);
  // A removal killed after the tree went: the rest stays on the node until the removal is asked again.
  await fs.rm(a.store.treeDir("pvc-cut"), { recursive: true });
  await removeTree(a.store, "pvc-cut", { url: a.remote.url, ref: "main" }, logger);
  await collectGarbage(a.store, logger, (_repoDir, work) => work(), { reach: () => undefined, ownerRefRetentionMs: HOUR, watch: a.watch });

  for (const v of ["pvc-gone", "pvc-cut"]) {
    assert.equal(await revParse(repo, upstreamOwnerRef(v)), "", `the view of ${v}'s owner ref is deleted`);
    assert.equal(await revParse(repo, volumeBranchRef(v)), "", `${v}'s branch is deleted`);
    assert.equal(await exists(a.store.volumeDir(v)), false, `${v}'s own files are removed`);
    assert.ok(
      lines.some((l) => l.volume === v && l.operation === "gc" && l.ref === upstreamOwnerRef(v)),
      `the deletion of ${v}'s view is logged`,
    );
  }
  assert.notEqual(await revParse(repo, upstreamOwnerRef("pvc-keep")), "", "the kept tree's view stays");
  assert.deepEqual((await repo.raw(["for-each-ref", "--format=%(refname)", "refs/git-csi/collect/"])).trim(), "", "nothing the collection fetched stays");
});

test("a kept tree no stage serves sends the commits its remote lacks to a stranded ref, once, and only where it may reach the remote", async (t: TestContext) => {
  const a = await stagedNode(t, "pvc-kept");
  const treeDir = a.store.treeDir("pvc-kept");
  const tree = a.store.tree(a.remote.url, "pvc-kept", AUTHOR);
  await fs.writeFile(path.join(treeDir, "late.txt"), "late\n");
  await runGit(tree, ["add", "late.txt"]);
  await runGit(tree, ["commit", "--quiet", "-m", "late"]);
  const head = await revParse(tree, "HEAD");
  let staged = true;
  const strandOnce = async () => {
    const { logger, lines } = quietLogger();
    await collectGarbage(a.store, logger, (_repoDir, work) => work(), {
      reach: () => undefined,
      ownerRefRetentionMs: HOUR,
      watch: a.watch,
      strand: { staged: () => staged, anonymous: () => a.onRemote },
    });
    return lines;
  };
  const told = (lines: Line[]) => lines.filter((l) => l.volume === "pvc-kept" && l.reason === "GitVolumeStranded");
  const stranded = () => remoteRefs(a.remote, strandedRef("pvc-kept"));

  // Staged here: its own sync pushes.
  assert.deepEqual(told(await strandOnce()), []);
  assert.deepEqual(stranded(), []);
  // Unstaged, with no record of the stage: it may want a credential the node does not keep.
  staged = false;
  const unknown = await strandOnce();
  assert.deepEqual(stranded(), []);
  assert.deepEqual(told(unknown), []);
  assert.ok(unknown.some((l) => l.volume === "pvc-kept" && /its remote wants a credential and no volume of it is staged here with one/.test(String(l.message))));
  // A stage without a Secret: the remote is reached without one.
  await rememberStage(a.store, "pvc-kept", { credentialExpected: false });
  const sent = await strandOnce();
  assert.deepEqual(stranded(), [strandedRef("pvc-kept", head)]);
  assert.equal(told(sent).length, 1);
  assert.match(String(told(sent)[0]!.message), new RegExp(`^1 commit\\(s\\) no push landed on main before the volume was unstaged wait on ${strandedRef("pvc-kept", head)}`));
  // What the remote holds is not sent again: found there once the node forgot it sent it, and not looked for once the ref went.
  await fs.rm(path.join(a.store.volumeDir("pvc-kept"), "stranded"));
  const found = await strandOnce();
  assert.deepEqual(told(found), []);
  assert.ok(found.some((l) => l.volume === "pvc-kept" && l.message === "the remote holds the kept work tree's commits already; none is sent again"));
  a.remote.git("update-ref", "-d", strandedRef("pvc-kept", head));
  assert.deepEqual(told(await strandOnce()), []);
  assert.deepEqual(stranded(), []);
  // The tree keeps its commit throughout.
  assert.equal(await revParse(a.store.repo(a.remote.url), volumeBranchRef("pvc-kept")), head);
});

test("the view of a ref read-only volumes serve and its repository stay through the collection while one of them is staged, and go once the last is released", async (t: TestContext) => {
  const remote = await servedRemote(t);
  const stateDir = await tempDir(t, "reader-node");
  const { logger, lines } = quietLogger();
  const deps = workerDeps(stateDir, logger);
  // The forge holds a metadata ref, which a reader of a branch fetches with it.
  remote.git("update-ref", METADATA_REF, remote.git("rev-parse", "main"));
  const source = { url: remote.url, ref: "main" };
  const first = await checkoutReader(deps, { volumeId: "pvc-reader", source, serving: "", pods: [], sharing: [] });
  // A second volume of the same URL and ref, the branch written in full: one checkout serves both.
  const sharing = [{ volumeId: "pvc-reader", pods: [], serving: first.treePath }];
  const { commit, treePath } = await checkoutReader(deps, { volumeId: "pvc-reader-2", source: { ...source, ref: "refs/heads/main" }, serving: "", pods: [], sharing });
  assert.equal(treePath, first.treePath);
  const key = readerKeyOfSource(source);
  const repo = deps.store.repo(remote.url);
  const collectOnce = () => collectGarbage(deps.store, logger, (_repoDir, work) => work(), { reach: () => undefined, ownerRefRetentionMs: HOUR, watch: new OwnerWatch() });

  // No writer's tree follows the repository: only the reader's checkout does.
  await collectOnce();
  assert.equal(await revParse(repo, readerRef(key)), commit, "the reader's view stays, so its next fetch is incremental");
  assert.equal(await revParse(repo, readerMetadataRef(key)), commit, "so does its view of the metadata");
  assert.ok(
    lines.some((l) => l.operation === "gc" && l.readerViews === 2),
    "the collection counted the reader's views",
  );

  await releaseReader(deps, { volumeId: "pvc-reader", source, last: false });
  await collectOnce();
  assert.equal(await revParse(repo, readerRef(key)), commit, "the view stays while a volume of the ref is staged");
  assert.ok(await exists(treePath), "so does the checkout it serves");
  await releaseReader(deps, { volumeId: "pvc-reader-2", source, last: true });
  assert.equal(await exists(treePath), false, "the last volume's release takes the checkout");
  await collectOnce();
  assert.equal(await exists(deps.store.repoDir(remote.url)), false, "the repository no volume follows goes");
});
