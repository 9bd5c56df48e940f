import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { status } from "@grpc/grpc-js";
import { gitWorker } from "@git-csi/protos";
import { RemoteAccess } from "../src/remote/access";
import { CredentialBroker } from "../src/remote/broker";
import { gitIn } from "../src/remote/git";
import { MountLease, type OnRemote, writeRecords } from "../src/lease/lease";
import { type OwnerRecord, parseRecord } from "../src/lease/ownership";
import { type RenewalMember, renewMounts, renewTogether } from "../src/lease/renewal";
import { ownerRef, Store } from "../src/trees/store";
import { type ServedRemote, servedRemote, tempDir } from "./remote";

/**
 * Batch renewals against real remotes served by git daemon: each remote's
 * pre-receive hook logs every push it receives, with the refs it updates, so
 * the tests count pushes where a forge would.
 */

const LEASE_MS = 90_000;

interface CountedRemote extends ServedRemote {
  /** The pushes the remote received, each as the refs it updated. */
  pushes: () => Promise<string[][]>;
  record: (volumeId: string) => OwnerRecord;
  owner: (volumeId: string) => string;
}

async function countedRemote(t: TestContext): Promise<CountedRemote> {
  const served = await servedRemote(t);
  const log = path.join(path.dirname(served.dir), "pushes.log");
  await fs.writeFile(log, "");
  // One line per push: the refs it updates, as receive-pack hands them to the hook.
  await fs.writeFile(path.join(served.dir, "hooks", "pre-receive"), `#!/bin/sh\nawk '{printf "%s ", $3} END {print ""}' >> '${log}'\n`, { mode: 0o755 });
  return {
    ...served,
    pushes: async () =>
      (await fs.readFile(log, "utf8"))
        .split("\n")
        .filter(Boolean)
        .map((line) => line.trim().split(" ")),
    record: (volumeId) => parseRecord(served.git("show", "-s", "--format=%B", ownerRef(volumeId))),
    owner: (volumeId) => served.git("rev-parse", ownerRef(volumeId)),
  };
}

/** One node's worker side of a remote: the URL's bare repository, and git to the remote as sync.ts reaches it. */
async function nodeOn(t: TestContext, remote: ServedRemote): Promise<{ store: Store; remote: OnRemote; lease: (volumeId: string, epoch: string) => MountLease }> {
  const stateDir = await tempDir(t, "node");
  const store = new Store(stateDir);
  await store.ensureRepo(remote.url);
  const access = await RemoteAccess.open(undefined, store.volumeDir("any"), store.socketDir(), new CredentialBroker(path.join(stateDir, "broker.sock")));
  t.after(() => access.close());
  return {
    store,
    remote: (operation) => access.run((options) => operation(store.repo(remote.url, options))),
    lease: (volumeId, epoch) =>
      new MountLease({ volumeId, node: "node-a", epoch, accessMode: "ReadWriteOnce", leaseMs: LEASE_MS, continues: false }, (env = {}) => store.repo(remote.url, { config: [], env })),
  };
}

/** Leases of these volumes, each claimed: what a node holds after staging them. */
async function claimed(node: Awaited<ReturnType<typeof nodeOn>>, volumeIds: string[]): Promise<MountLease[]> {
  const leases = volumeIds.map((id) => node.lease(id, `epoch-${id}`));
  for (const lease of leases) assert.equal((await lease.claim(node.remote)).held, true);
  return leases;
}

/** Another node's claim of a volume, written straight into the remote: its lease took over. */
async function takenOver(remote: CountedRemote, volumeId: string): Promise<string> {
  const now = Date.now();
  const record: OwnerRecord = { volumeId, node: "node-b", epoch: "epoch-b", accessMode: "ReadWriteOnce", time: now, expires: now + LEASE_MS, released: false };
  const [oid] = await writeRecords(gitIn(remote.dir, { GIT_DIR: remote.dir }), [record]);
  remote.git("update-ref", ownerRef(volumeId), oid!);
  return oid!;
}

test("a batch renews every volume of a remote in one push, each owner ref from the record last written", async (t) => {
  const remote = await countedRemote(t);
  const node = await nodeOn(t, remote);
  const volumes = ["pvc-1", "pvc-2", "pvc-3"];
  const leases = await claimed(node, volumes);
  const before = new Map(volumes.map((id) => [id, remote.record(id)]));
  const pushesBefore = (await remote.pushes()).length;
  await sleep(5);

  await renewTogether(leases, node.remote, node.store.repo(remote.url));

  const pushes = (await remote.pushes()).slice(pushesBefore);
  assert.deepEqual(pushes, [volumes.map(ownerRef)], "one push carries every owner ref");
  for (const [i, id] of volumes.entries()) {
    const record = remote.record(id);
    assert.equal(record.epoch, `epoch-${id}`);
    assert.ok(record.time > before.get(id)!.time, `${id}'s record moved on`);
    assert.equal(record.expires, record.time + LEASE_MS);
    const state = leases[i]!.state();
    assert.equal(state.held, true);
    assert.ok(Number(state.serveUntilUnixMs) > Number(before.get(id)!.expires) - LEASE_MS / 10);
  }
});

test("a batch in which one volume lost its epoch renews the rest, in one push received, and never renews the lost one", async (t) => {
  const remote = await countedRemote(t);
  const node = await nodeOn(t, remote);
  const volumes = ["pvc-a", "pvc-b", "pvc-c"];
  const leases = await claimed(node, volumes);
  // Another node's epoch took pvc-b over; this node has not seen it.
  const theirs = await takenOver(remote, "pvc-b");
  const pushesBefore = (await remote.pushes()).length;

  await renewTogether(leases, node.remote, node.store.repo(remote.url));

  // The atomic push carrying pvc-b's stale compare-and-swap was refused before it reached the remote's hooks.
  assert.deepEqual((await remote.pushes()).slice(pushesBefore), [[ownerRef("pvc-a"), ownerRef("pvc-c")]]);
  assert.equal(remote.owner("pvc-b"), theirs, "the other node's record stays");
  assert.equal(remote.record("pvc-a").epoch, "epoch-pvc-a");
  assert.equal(remote.record("pvc-c").epoch, "epoch-pvc-c");
  assert.equal(leases[0]!.state().held, true);
  assert.equal(leases[2]!.state().held, true);
  const lost = leases[1]!.state();
  assert.equal(lost.held, false);
  assert.equal(lost.refusal, gitWorker.LeaseRefusal.LEASE_REFUSAL_SUPERSEDED);
  assert.match(lost.message, /taken over by node node-b/);

  // The next interval: the lost volume is not even asked about.
  const second = (await remote.pushes()).length;
  await renewTogether(leases, node.remote, node.store.repo(remote.url));
  assert.deepEqual((await remote.pushes()).slice(second), [[ownerRef("pvc-a"), ownerRef("pvc-c")]]);
  assert.equal(remote.owner("pvc-b"), theirs);
});

test("a lease busy with a step of its own drops out of the batch after the join budget; the others renew without waiting for it", async (t) => {
  const remote = await countedRemote(t);
  const node = await nodeOn(t, remote);
  const [idle, busy] = await claimed(node, ["pvc-idle", "pvc-busy"]);
  const busyBefore = remote.owner("pvc-busy");
  const idleBefore = remote.owner("pvc-idle");
  let finish!: () => void;
  const holding = busy!.hold(() => new Promise<void>((resolve) => (finish = resolve)));
  const pushesBefore = (await remote.pushes()).length;

  const started = Date.now();
  await renewTogether([idle!, busy!], node.remote, node.store.repo(remote.url), 300);
  assert.ok(Date.now() - started < 5_000, "the batch did not wait for the busy lease");
  finish();
  await holding;

  assert.deepEqual((await remote.pushes()).slice(pushesBefore), [[ownerRef("pvc-idle")]]);
  assert.notEqual(remote.owner("pvc-idle"), idleBefore);
  assert.equal(remote.owner("pvc-busy"), busyBefore);
  assert.equal(busy!.state().held, true, "left out is not lost: the next batch renews it");
});

test("RenewMounts pushes once per remote, answers in the request's order, and refuses a request with a field missing before renewing anything", async (t) => {
  const [one, two] = [await countedRemote(t), await countedRemote(t)];
  const [nodeOne, nodeTwo] = [await nodeOn(t, one), await nodeOn(t, two)];
  const members = new Map<string, RenewalMember>();
  const join = async (node: Awaited<ReturnType<typeof nodeOn>>, remote: ServedRemote, ids: string[]) => {
    for (const lease of await claimed(node, ids)) {
      members.set(lease.holder.volumeId, { lease, key: remote.url, remote: node.remote, local: () => node.store.repo(remote.url), renewed: () => undefined });
    }
  };
  await join(nodeOne, one, ["pvc-1", "pvc-2", "pvc-3"]);
  await join(nodeTwo, two, ["pvc-4", "pvc-5"]);
  const find = (volumeId: string, epoch: string): RenewalMember | gitWorker.RenewedMount => {
    const member = members.get(volumeId);
    if (!member) return { volumeId, code: status.NOT_FOUND, error: `volume ${volumeId} is not staged on this node` };
    assert.equal(epoch, member.lease.holder.epoch);
    return member;
  };
  const counts = async () => [(await one.pushes()).length, (await two.pushes()).length];

  const before = await counts();
  await assert.rejects(
    renewMounts(
      {
        mounts: [
          { volumeId: "pvc-1", epoch: "epoch-pvc-1" },
          { volumeId: "pvc-2", epoch: "" },
        ],
      },
      find,
    ),
    (err: { code?: number; message: string }) => err.code === status.INVALID_ARGUMENT && /mounts\[1\]\.epoch is required/.test(err.message),
  );
  assert.deepEqual(await counts(), before, "a refused request pushes nothing");

  const ids = ["pvc-4", "pvc-1", "pvc-gone", "pvc-2", "pvc-5", "pvc-3"];
  const answer = await renewMounts({ mounts: ids.map((volumeId) => ({ volumeId, epoch: `epoch-${volumeId}` })) }, find);
  assert.deepEqual(
    answer.mounts.map((m) => m.volumeId),
    ids,
  );
  const after = await counts();
  assert.deepEqual([after[0]! - before[0]!, after[1]! - before[1]!], [1, 1], "one push per remote");
  for (const m of answer.mounts) {
    if (m.volumeId === "pvc-gone") {
      assert.equal(m.code, status.NOT_FOUND);
      assert.equal(m.lease, undefined);
    } else {
      assert.equal(m.code, status.OK);
      assert.equal(m.lease?.held, true, m.volumeId);
    }
  }
});
