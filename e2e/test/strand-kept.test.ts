import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { csi } from "@git-csi/protos";
import { createVolume, type Driver, freePort, type PublishedVolume, report, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage, volumeLogs, waitFor } from "../src/driver";
import { type GitDaemon, startGitDaemon } from "../src/git-server";

const RWO = csi.VolumeCapability_AccessMode_Mode.SINGLE_NODE_MULTI_WRITER;
/** Spec 000's 90 s and 20 s, scaled down so the test can outwait a lease. */
const LEASE = { duration: "6s", renewInterval: "2s" };
const CLASS = { "push.quiesce": "2s", "push.maxLatency": "1h" };

let server: GitDaemon;
let a: Driver;
let b: Driver;
const repo = "kept.git";

before(async () => {
  server = await startGitDaemon();
  await server.createRepo(repo, { files: { "configuration.yaml": "a: 1\n" } });
  // Node A collects every second, as its hourly timer would; B keeps the default.
  [a, b] = await Promise.all([
    startDriver({ nodeId: "node-a", lease: LEASE, ownMountNamespace: true, gcInterval: "1s", metricsPort: await freePort() }),
    startDriver({ nodeId: "node-b", lease: LEASE, ownMountNamespace: true }),
  ]);
});

after(async () => {
  await Promise.all([a?.stop(), b?.stop()]);
  await server?.stop();
});

const onRemote = (file: string, ref = "main") => server.git(repo, "show", `${ref}:${file}`).catch(() => undefined);
const strandedRefs = async (volumeId: string) => (await server.git(repo, "for-each-ref", "--format=%(refname)", `refs/git-csi/stranded/${volumeId}/`)).split("\n").filter(Boolean);
const pids = async (driver: Driver) => Promise.all((["git-worker", "mount-owner", "csi-frontend"] as const).map((s) => driver.pid(s)));
/** Every epoch the volume's owner ref ever named. */
const epochs = async (volumeId: string) => [...(await server.git(repo, "log", "--format=%B", `refs/git-csi/owner/${volumeId}`)).matchAll(/^epoch: (\S+)$/gm)].map((m) => m[1]!);
const strandedLines = (driver: Driver, volumeId: string) =>
  volumeLogs(driver, volumeId)
    .split("\n")
    .filter((l) => l.includes('"operation":"strand"') || l.includes('"reason":"GitVolumeStranded"'));

test("a lost epoch's commits that its unstage could not strand (the remote away) reach a stranded ref at the node's next collection, and another node's stage brings them in", async () => {
  const volume = await createVolume(a, "kept-strand", server.url(repo), RWO);
  const onA = await stageAndPublish(a, volume, RWO, "app-a");
  await setVolumeClass(a, volume.volumeId, CLASS);
  await a.sh(`echo one > '${onA.targetPath}/one.txt'`);
  await waitFor("A's first write on the remote", () => onRemote("one.txt"));

  // A writes once more and freezes before its quiesce ends: that commit is made only after B took the volume.
  await a.sh(`echo late > '${onA.targetPath}/late.txt'`);
  const frozen = await pids(a);
  for (const pid of frozen) process.kill(pid, "SIGSTOP");
  let onB: PublishedVolume;
  try {
    // B takes the volume once it has watched A's record unchanged for a lease.
    onB = await waitFor("B's stage to take the volume", () => stageAndPublish(b, volume, RWO, "app-b"), 60_000);
  } finally {
    for (const pid of frozen) process.kill(pid, "SIGCONT");
  }
  await setVolumeClass(b, volume.volumeId, CLASS);
  await b.sh(`echo from-b > '${onB.targetPath}/b.txt'`);
  await waitFor("B's write on the remote", () => onRemote("b.txt"));
  await waitFor("A's push of the late write to be refused", async () => (await report(a, volume.volumeId)).pushFailures > 0);

  // The remote goes away; A's unstage completes on the node, and its commit stays in the tree A keeps.
  await server.down();
  await unpublishAndUnstage(a, onA);
  assert.deepEqual(await strandedRefs(volume.volumeId), []);
  await waitFor("A's word that the commit stays in its tree", async () =>
    /commit\(s\) no push landed stay in the node's work tree until its collection reaches the remote/.test(volumeLogs(a, volume.volumeId)),
  );

  // The remote comes back: without any stage on A, A's collection sends the commit to a stranded ref.
  await server.up();
  const [stranded] = await waitFor("A's kept commit on a stranded ref", async () => {
    const refs = await strandedRefs(volume.volumeId);
    return refs.length > 0 && refs;
  });
  assert.match(stranded!, new RegExp(`^refs/git-csi/stranded/${volume.volumeId}/[0-9a-f]{40}$`));
  assert.equal(await onRemote("late.txt", stranded), "late");
  assert.equal(await onRemote("late.txt"), undefined, "no branch follows the stranded ref");
  const toldOf = () => strandedLines(a, volume.volumeId).filter((l) => l.includes('"reason":"GitVolumeStranded"'));
  // The line follows the push: the node's log may reach the test a moment after the ref.
  const told = await waitFor("A's GitVolumeStranded line", async () => toldOf().length > 0 && toldOf());
  assert.equal(told.length, 1, told.join("\n"));
  assert.match(told[0]!, new RegExp(`wait on ${stranded}: the volume's next stage, on any node, brings them in`));
  // No epoch in what A said of it.
  const said = strandedLines(a, volume.volumeId).join("\n");
  for (const epoch of await epochs(volume.volumeId)) assert.ok(!said.includes(epoch), `an epoch in the log:\n${said}`);

  // B's next stage brings A's commit in, its push lands it on main, and the stranded ref goes.
  await unpublishAndUnstage(b, onB);
  const again = await stageAndPublish(b, volume, RWO, "app-b");
  assert.equal(await b.sh(`cat '${again.targetPath}/late.txt'`), "late\n");
  assert.equal(await b.sh(`cat '${again.targetPath}/b.txt'`), "from-b\n");
  await unpublishAndUnstage(b, again);
  assert.equal(await onRemote("late.txt"), "late");
  assert.deepEqual(await strandedRefs(volume.volumeId), []);

  // A's next collections send nothing again: the remote holds the commit.
  const collections = () =>
    a
      .logs()
      .split("\n")
      .filter((l) => l.includes('"operation":"gc"') && l.includes('"message":"collected ')).length;
  const seen = collections();
  await waitFor("two more collections on A", async () => collections() >= seen + 2);
  assert.deepEqual(await strandedRefs(volume.volumeId), []);
  assert.equal(toldOf().length, 1);
});
