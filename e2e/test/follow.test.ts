import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { status } from "@grpc/grpc-js";
import { call, csi } from "@git-csi/protos";
import { type Driver, freePort, metricsText, metricValue, type PublishedVolume, refused, report, run, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { publish } from "../src/driver";
import { type GitDaemon, type GitServer, fetchOnly, startGitDaemon } from "../src/git-server";

const READER = csi.VolumeCapability_AccessMode_Mode.MULTI_NODE_READER_ONLY;
const CLI = path.join(__dirname, "..", "..", "..", "packages", "cli", "dist", "src", "main.js");

/** A log line of the driver holds every fragment. */
function logged(driver: Driver, ...fragments: string[]): boolean {
  return driver
    .logs()
    .split("\n")
    .some((line) => fragments.every((f) => line.includes(f)));
}

/** A reader volume of the repository, as a static PersistentVolume names it. */
function readerVolume(volumeId: string, url: string): csi.Volume {
  return { volumeId, capacityBytes: 0, volumeContext: { url, ref: "main" }, contentSource: undefined, accessibleTopology: [] };
}

/** Every ref the remote holds, as `git ls-remote` lists them: the remote's whole state as a client sees it. */
async function remoteRefs(server: GitServer, repo: string): Promise<string> {
  return server.git(repo, "for-each-ref", "--format=%(objectname) %(refname)");
}

/** A write through the mount, and the kernel's answer to it. */
async function refusedWrite(driver: Driver, script: string): Promise<string> {
  const failed = await driver.sh(script).then(
    () => undefined,
    (err: { stderr?: string }) => err.stderr ?? "",
  );
  assert.ok(failed !== undefined, `the write was accepted: ${script}`);
  return failed;
}

describe("read-only volumes: many nodes serve one ref, write nothing, claim nothing", () => {
  const repo = "dashboards.git";
  let server: GitServer;
  let nodes: Driver[] = [];
  let pushes: () => Promise<string[][]>;

  before(async () => {
    server = await startGitDaemon();
    await server.createRepo(repo, { files: { "dashboards/home.json": '{"title":"home"}\n', "README.md": "dashboards\n" } });
    // A forge that serves fetches and refuses every push, as a read-only deploy key does.
    pushes = await fetchOnly(server, repo);
    // Two nodes: their own state, node id and mount namespace, one remote.
    nodes = await Promise.all(["reader-a", "reader-b"].map((nodeId) => startDriver({ nodeId, ownMountNamespace: true })));
  });

  // Never throws: a hook that fails would leave the drivers and their mounts running.
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop().catch((err: Error) => console.error(`stopping a driver: ${err.message}`))));
    await server?.stop().catch((err: Error) => console.error(`stopping the git server: ${err.message}`));
  });

  test("two nodes stage one ReadOnlyMany volume: both serve the tree, every write fails with EROFS, and the remote's refs do not change", async () => {
    const before = await remoteRefs(server, repo);
    const volume = readerVolume("dashboards", server.url(repo));
    const published: PublishedVolume[] = [];
    for (const [i, node] of nodes.entries()) published.push(await stageAndPublish(node, volume, READER, `viewer-${i}`));
    for (const [i, node] of nodes.entries()) {
      const target = published[i]!.targetPath;
      assert.equal(await node.sh(`cat '${target}/dashboards/home.json'`), '{"title":"home"}\n');
      for (const write of [
        `echo x > '${target}/new.txt'`,
        `echo x >> '${target}/README.md'`,
        `mkdir '${target}/d'`,
        `rm '${target}/README.md'`,
        `mv '${target}/README.md' '${target}/r.md'`,
        `touch '${target}/README.md'`,
      ]) {
        assert.match(await refusedWrite(node, write), /Read-only file system/, write);
      }
      // The staging mount itself refuses too, not only the pod's bind of it.
      assert.match(await refusedWrite(node, `echo x > '${published[i]!.stagingPath}/new.txt'`), /Read-only file system/);
      assert.equal(await node.sh(`cat '${target}/README.md'`), "dashboards\n");
      // The kubelet's condition check: a reader has no epoch, and nothing is wrong.
      const stats = await call(node.node.nodeGetVolumeStats.bind(node.node), csi.NodeGetVolumeStatsRequest.fromPartial({ volumeId: volume.volumeId, volumePath: target }), 60_000);
      assert.equal(stats.volumeCondition?.abnormal, false, stats.volumeCondition?.message);
    }
    for (const [i, node] of nodes.entries()) await unpublishAndUnstage(node, published[i]!);
    assert.equal(await remoteRefs(server, repo), before, "the remote's refs changed");
    assert.doesNotMatch(await remoteRefs(server, repo), /refs\/git-csi\//);
    assert.deepEqual(await pushes(), [], "a reader tried to push");
  });
});

/** A file of one commit: 64 KiB of lines that each name the commit and the file, so a torn read shows two numbers. */
function content(commit: number, file: string): string {
  return `commit ${commit} ${file}\n`.repeat(Math.ceil(65_536 / `commit ${commit} ${file}\n`.length));
}

/** The commit a whole file names; a file whose lines name two commits, or that is not a whole file of one, fails. */
function commitOf(text: string, file: string): number {
  const n = Number(/^commit (\d+) /.exec(text)?.[1]);
  assert.ok(Number.isInteger(n) && text === content(n, file), `${file} is torn or mixed: ${text.length} bytes, starting ${JSON.stringify(text.slice(0, 40))}`);
  return n;
}

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

describe("following: a read-only volume serves each new commit of its ref, switched whole at the mount's root", () => {
  const repo = "site.git";
  const INTERVAL_MS = 1000;
  const COMMITS = 200;
  let server: GitDaemon;
  let driver: Driver | undefined;

  before(async () => {
    server = await startGitDaemon({ countFetches: true });
    await server.createRepo(repo, { files: { "a.txt": content(0, "a"), "b.txt": content(0, "b") } });
    driver = await startDriver({ nodeId: "follower", metricsPort: await freePort() });
  });

  // Never throws: a hook that fails would leave the driver and its mounts running.
  after(async () => {
    await driver?.stop().catch((err: Error) => console.error(`stopping the driver: ${err.message}`));
    await server?.stop().catch((err: Error) => console.error(`stopping the git server: ${err.message}`));
  });

  test("a bad follow.interval is refused naming the field, and the volume keeps its class", async () => {
    const node = driver!;
    const volume = await stageAndPublish(node, readerVolume("bad-interval", server.url(repo)), READER, "bad-interval");
    await refused(setVolumeClass(node, volume.volumeId, { "follow.interval": "often" }), status.INVALID_ARGUMENT, [/follow\.interval/, /"often" is not a duration/]);
    await refused(setVolumeClass(node, volume.volumeId, { "follow.interval": "100ms" }), status.INVALID_ARGUMENT, [/follow\.interval/, /from 1s/]);
    await unpublishAndUnstage(node, volume);
  });

  test(`${COMMITS} upstream commits: readers never see a torn file or an older commit after a newer one, an open file keeps its content, and each commit shows within the interval plus 2 s`, async () => {
    const node = driver!;
    const volume = await stageAndPublish(node, readerVolume("site", server.url(repo)), READER, "site");
    const target = volume.targetPath;
    await setVolumeClass(node, volume.volumeId, { "follow.interval": `${INTERVAL_MS / 1000}s` });
    const held = await fs.open(path.join(target, "a.txt"));
    const pushedAt: number[] = [0];
    const seenAt: number[] = [0];
    let writing = true;
    // Once the writer stops, the readers wait this long at most for the last commit.
    let readUntil = Infinity;
    /** One reader: a, then b, again and again; b is never older than a, and neither older than what it saw before. */
    const reader = async () => {
      let last = 0;
      let reads = 0;
      while (writing || (last < COMMITS && Date.now() < readUntil)) {
        const a = commitOf(await fs.readFile(path.join(target, "a.txt"), "utf8"), "a");
        const b = commitOf(await fs.readFile(path.join(target, "b.txt"), "utf8"), "b");
        assert.ok(a >= last && b >= a, `read commit ${a} then ${b} after ${last}`);
        for (let n = last + 1; n <= b; n++) seenAt[n] ??= Date.now();
        last = b;
        reads++;
      }
      return reads;
    };
    const readers = [reader(), reader(), reader()];
    for (let n = 1; n <= COMMITS; n++) {
      await server.commitFiles(repo, { "a.txt": content(n, "a"), "b.txt": content(n, "b") }, { message: `commit ${n}` });
      pushedAt[n] = Date.now();
      // An upstream that pushes at its own pace, faster than the interval: many commits land between two fetches.
      await sleep(50);
    }
    writing = false;
    readUntil = Date.now() + INTERVAL_MS + 5000;
    const reads = await Promise.all(readers);
    // The descriptor opened before the first switch still reads the commit it opened, whole.
    assert.equal(commitOf((await held.readFile()).toString("utf8"), "a"), 0);
    await held.close();
    const lags = pushedAt.slice(1).map((at, i) => (seenAt[i + 1] ?? Infinity) - at);
    const median = percentile(lags, 0.5);
    const worst = Math.max(...lags);
    console.log(`follow: ${COMMITS} commits, ${reads.join("+")} pair reads; lag from push to visible: median ${median} ms, worst ${worst} ms (interval ${INTERVAL_MS} ms)`);
    assert.ok(worst <= INTERVAL_MS + 2000, `a commit became visible ${worst} ms after its push`);
    assert.ok(logged(node, '"reason":"GitVolumeUpdated"', '"volume":"site"'));
    assert.doesNotMatch(await server.git(repo, "for-each-ref"), /refs\/git-csi\//);
    await unpublishAndUnstage(node, volume);
  });

  test("a fetch that fails keeps the last commit served and says so in the events, the report and the metrics; the next one that works serves the new commit", async () => {
    const node = driver!;
    const volume = await stageAndPublish(node, readerVolume("outage", server.url(repo)), READER, "outage");
    await setVolumeClass(node, volume.volumeId, { "follow.interval": "1s" });
    const served = await fs.readFile(path.join(volume.targetPath, "a.txt"), "utf8");
    const servedCommit = await server.git(repo, "rev-parse", "main");
    assert.equal((await report(node, "outage")).servedCommit, servedCommit);
    assert.equal(metricValue(await metricsText(node), "git_csi_served_commit", "outage"), 1);
    assert.match(await metricsText(node), new RegExp(`git_csi_served_commit\\{[^}]*claim="outage",commit="${servedCommit}"\\} 1`));
    // The forge loses the repository for a while.
    await fs.rename(server.repoPath(repo), `${server.repoPath(repo)}.away`);
    await waitFor("a failed fetch reported", async () => logged(node, '"reason":"GitVolumeFetchFailed"', '"volume":"outage"'));
    assert.equal(await fs.readFile(path.join(volume.targetPath, "a.txt"), "utf8"), served);
    await waitFor("the report says it is behind", async () => (await report(node, "outage")).abnormal.some((a) => a.includes(`keeps serving commit ${servedCommit}`)));
    assert.equal(metricValue(await metricsText(node), "git_csi_volume_abnormal", "outage"), 1);
    const human = (await run(process.execPath, [CLI, "report", "outage", "--metrics-address", new URL(node.metricsUrl).host])).stdout;
    assert.match(human, new RegExp(`status: ABNORMAL \\(1\\)[\\s\\S]*read-only: serves commit ${servedCommit} of main`));
    await fs.rename(`${server.repoPath(repo)}.away`, server.repoPath(repo));
    const next = commitOf(served, "a") + 1;
    const nextCommit = await server.commitFiles(repo, { "a.txt": content(next, "a"), "b.txt": content(next, "b") }, { message: `commit ${next}` });
    await waitFor("the new commit served", async () => commitOf(await fs.readFile(path.join(volume.targetPath, "a.txt"), "utf8"), "a") === next);
    const after = await report(node, "outage");
    assert.deepEqual([after.servedCommit, after.abnormal], [nextCommit, []]);
    const metrics = await metricsText(node);
    assert.equal(metricValue(metrics, "git_csi_volume_abnormal", "outage"), 0);
    // One series per volume: the old commit's label is gone.
    assert.deepEqual(
      metrics.split("\n").filter((l) => l.startsWith("git_csi_served_commit{") && l.includes('claim="outage"')),
      [`git_csi_served_commit{namespace="",claim="outage",commit="${nextCommit}"} 1`],
    );
    await unpublishAndUnstage(node, volume);
  });

  test("a mount owner killed and restarted serves the kept mount again, read-only, and it goes on following", async () => {
    const node = driver!;
    const volume = await stageAndPublish(node, readerVolume("restarted", server.url(repo)), READER, "restarted");
    await setVolumeClass(node, volume.volumeId, { "follow.interval": "1s" });
    const file = path.join(volume.targetPath, "a.txt");
    const served = commitOf(await fs.readFile(file, "utf8"), "a");
    const pid = await node.pid("mount-owner");
    process.kill(pid, "SIGKILL");
    await waitFor("a new mount owner", async () => (await node.pid("mount-owner")) !== pid);
    await waitFor("the kept mount resumed", async () => logged(node, '"resumed read-only"', '"volume":"restarted"'));
    assert.equal(commitOf(await fs.readFile(file, "utf8"), "a"), served);
    assert.match(await refusedWrite(node, `echo x > '${file}'`), /Read-only file system/);
    const next = served + 1;
    await server.commitFiles(repo, { "a.txt": content(next, "a"), "b.txt": content(next, "b") }, { message: `commit ${next}` });
    await waitFor("the new commit served after the restart", async () => commitOf(await fs.readFile(file, "utf8"), "a") === next);
    await unpublishAndUnstage(node, volume);
  });

  test("fifty pods of one follower and a second volume of its URL and ref cost one fetch per interval and one checkout; with a read-only key, a day of hourly intervals leaves the remote's refs as they were", async () => {
    const node = driver!;
    const shared = "rules.git";
    const initial = await server.createRepo(shared, { files: { "a.txt": content(0, "a"), "b.txt": content(0, "b") } });
    const pushes = await fetchOnly(server, shared);
    const url = server.url(shared);
    const first = await stageAndPublish(node, readerVolume("shared-a", url), READER, "shared-a-0");
    const pods = [first];
    for (let i = 1; i < 50; i++) {
      pods.push({ ...first, targetPath: path.join(node.dir, "pods", `shared-a-${i}`, "volume") });
      await publish(node, pods[i]!, {}, READER);
    }
    // The same branch written the other way: one URL and ref.
    const second = await stageAndPublish(node, { ...readerVolume("shared-b", url), volumeContext: { url, ref: "refs/heads/main" } }, READER, "shared-b");
    pods.push(second);
    // The group follows at the shorter interval of the two.
    await setVolumeClass(node, "shared-a", { "follow.interval": "1s" });
    await setVolumeClass(node, "shared-b", { "follow.interval": "2s" });
    const commit = await server.commitFiles(shared, { "a.txt": content(1, "a"), "b.txt": content(1, "b") }, { message: "commit 1" });
    const served = async () => (await Promise.all(pods.map((p) => fs.readFile(path.join(p.targetPath, "a.txt"), "utf8")))).every((t) => commitOf(t, "a") === 1);
    await waitFor("every pod of both volumes serves the new commit", served);
    for (const volumeId of ["shared-a", "shared-b"]) {
      await waitFor(`GitVolumeUpdated on ${volumeId}`, async () => logged(node, '"reason":"GitVolumeUpdated"', `"volume":"${volumeId}"`));
      assert.equal((await report(node, volumeId)).servedCommit, commit, volumeId);
      assert.match(await metricsText(node), new RegExp(`git_csi_served_commit\\{[^}]*claim="${volumeId}",commit="${commit}"\\} 1`));
    }
    // A day at follow.interval 1h is 24 fetches: run at the class's shortest interval, 1s, on the real clock.
    const refs = await remoteRefs(server, shared);
    const INTERVALS = 24;
    const counted = await server.fetches(shared);
    const start = Date.now();
    await waitFor(`${INTERVALS} fetches at the remote`, async () => (await server.fetches(shared)) - counted >= INTERVALS, 60_000);
    const elapsed = Date.now() - start;
    console.log(`follow: ${INTERVALS} fetches of one URL and ref for ${pods.length} pods of two volumes took ${elapsed} ms (interval ${INTERVAL_MS} ms)`);
    // Each volume fetching on its own counts them in two thirds of the time; following at the longer interval, in twice the time.
    assert.ok(elapsed >= (INTERVALS - 1) * INTERVAL_MS, `${INTERVALS} fetches in ${elapsed} ms: more than one per interval`);
    assert.ok(elapsed < INTERVALS * 1.75 * INTERVAL_MS, `${INTERVALS} fetches took ${elapsed} ms: the group does not follow at its shortest interval`);
    const readers = path.join(node.stateDir, "readers");
    /** The checkouts of this repository's commits on the node, whatever directory holds them: another test's may be left. */
    const checkouts = async () => {
      const names = await Promise.all((await fs.readdir(readers)).map((key) => fs.readdir(path.join(readers, key))));
      return names.flat().filter((name) => name === initial || name === commit);
    };
    // The commit served before went at the next fetch: one directory serves both volumes.
    assert.deepEqual(await checkouts(), [commit], "one checkout directory for the URL and ref");

    assert.equal(await remoteRefs(server, shared), refs, "the remote's refs changed");
    assert.doesNotMatch(refs, /refs\/git-csi\//);
    assert.deepEqual(await pushes(), [], "a reader tried to push");

    // The checkout stays while a volume of the URL and ref is staged, and goes with the last.
    for (const pod of pods.slice(1, 50)) await call(node.node.nodeUnpublishVolume.bind(node.node), { volumeId: pod.volumeId, targetPath: pod.targetPath }, 60_000);
    await unpublishAndUnstage(node, first);
    assert.equal(commitOf(await fs.readFile(path.join(second.targetPath, "a.txt"), "utf8"), "a"), 1);
    await unpublishAndUnstage(node, second);
    assert.deepEqual(await checkouts(), [], "the last volume's unstage removes the checkout");
  });
});
