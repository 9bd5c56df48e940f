import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { METADATA_REF } from "@git-csi/config";
import { createLogger } from "@git-csi/logging";
import { gitcsi, gitWorker } from "@git-csi/protos";
import { listingPath, parseListing } from "../src/metadata/format";
import { claimMount, type Prepared, prepareVolume } from "../src/trees/prepare";
import type { VolumeSync } from "../src/sync/sync";
import { type ServedRemote, servedRemote, workerDeps } from "./remote";

/**
 * Two volumes of one repository on two nodes, each a real VolumeSync with
 * its own bare repository and work tree, pushing to one remote served by git
 * daemon. The remote's pre-receive hook holds alpha's push until beta's
 * landed, so the race every run has the same interleaving: alpha's atomic
 * push (its branch, its metadata record, its owner ref) loses to beta's.
 */

interface Volume {
  id: string;
  sync: VolumeSync;
  tree: string;
  /** What the volume's node logged. */
  logs: Record<string, unknown>[];
}

async function stage(t: TestContext, remote: ServedRemote, id: string, branch: string): Promise<Volume> {
  const stateDir = await fs.mkdtemp(path.join(os.tmpdir(), `git-worker-test-${id}-`));
  const staged: { sync?: VolumeSync } = {};
  // The watcher stops, and keeps its snapshot, before the directory goes.
  t.after(async () => {
    await staged.sync?.stop();
    await fs.rm(stateDir, { recursive: true, force: true });
  });
  const logger = createLogger(`git-worker-${id}`);
  const logs: Record<string, unknown>[] = [];
  for (const transport of logger.transports) transport.silent = true;
  logger.on("data", (info: Record<string, unknown>) => logs.push(info));
  // The test writes to the tree itself: no mount serves it.
  const deps = workerDeps(stateDir, logger);
  const prepared: Prepared = new Map();
  // Timers far off: only flush() commits and pushes.
  const volumeClass = { name: "test", parameters: { "push.quiesce": "1h", "push.maxLatency": "1h" } };
  await prepareVolume(deps, prepared, gitWorker.PrepareTreeRequest.fromPartial({ volumeId: id, source: { url: remote.url, ref: `refs/heads/${branch}` }, class: volumeClass }));
  const mount = { node: `node-${id}`, epoch: `epoch-${id}`, accessMode: gitcsi.AccessMode.READ_WRITE_ONCE_POD, leaseMs: 90_000, continues: false, servingLeftMs: 0 };
  const claimed = await claimMount(deps, prepared, "instance", { volumeId: id, mount });
  assert.equal(claimed.lease?.held, true, claimed.lease?.message);
  const sync = deps.syncs.get(id)!;
  staged.sync = sync;
  return { id, sync, tree: deps.store.treeDir(id), logs };
}

/** Writes a file of mode 0600 under the volume's own directory, and waits until the watcher told the volume. */
async function write(volume: Volume): Promise<string> {
  const file = path.join(volume.id, "config.yaml");
  await fs.mkdir(path.join(volume.tree, volume.id));
  await fs.writeFile(path.join(volume.tree, file), `${volume.id}\n`, { mode: 0o600 });
  for (let i = 0; !volume.sync.report().pendingPaths.includes(file); i++) {
    assert.ok(i < 200, `the watcher never reported ${file}`);
    await sleep(25);
  }
  return file;
}

/** The remote's hook: logs each push's refs, and holds alpha's first push until the test lets it go. */
async function holdAlphasPush(remote: ServedRemote): Promise<{ arrived: () => Promise<void>; release: () => Promise<void>; pushes: () => Promise<string[][]> }> {
  const base = path.dirname(remote.dir);
  const [hold, arrived, log] = ["hold", "arrived", "pushes.log"].map((name) => path.join(base, name)) as [string, string, string];
  await fs.writeFile(hold, "");
  await fs.writeFile(log, "");
  const hook = `#!/bin/sh
updates=$(cat)
echo "$updates" | awk '{printf "%s ", $3} END {print ""}' >> '${log}'
case "$updates" in *refs/git-csi/owner/alpha*)
  if [ -e '${hold}' ]; then touch '${arrived}'; while [ -e '${hold}' ]; do sleep 0.05; done; fi;;
esac
`;
  await fs.writeFile(path.join(remote.dir, "hooks", "pre-receive"), hook, { mode: 0o755 });
  return {
    arrived: async () => {
      for (
        let i = 0;
        !(await fs.stat(arrived).then(
          () => true,
          () => false,
        ));
        i++
      ) {
        assert.ok(i < 400, "alpha's push never reached the remote");
        await sleep(25);
      }
    },
    release: () => fs.rm(hold),
    pushes: async () =>
      (await fs.readFile(log, "utf8"))
        .split("\n")
        .filter(Boolean)
        .map((line) => line.trim().split(" ")),
  };
}

function rejections(volume: Volume): Record<string, unknown>[] {
  return volume.logs.filter((l) => l.message === "the push was rejected: the remote moved");
}

function events(volume: Volume, reason: string): number {
  return volume.sync.report().recentEvents.filter((e) => e.reason === reason).length;
}

/** The mode the remote's metadata ref records for a file of the branch. */
function recordedMode(remote: ServedRemote, branch: string, file: string): number | undefined {
  const listing = parseListing(remote.git("cat-file", "blob", `${METADATA_REF}:${listingPath(branch, path.dirname(file))}`));
  return listing.entries.find((e) => e.name === path.basename(file))?.mode;
}

/** Alpha's push held at the remote while beta's lands; then alpha's is refused, and alpha pushes again. */
async function race(remote: ServedRemote, alpha: Volume, beta: Volume): Promise<{ betasRecord: string; pushes: string[][] }> {
  const hook = await holdAlphasPush(remote);
  const alphaPushed = alpha.sync.flush();
  await hook.arrived();
  assert.deepEqual(await beta.sync.flush(), { pushed: true, message: `pushed to ${beta.sync.report().pushBranch}` });
  const betasRecord = remote.git("rev-parse", METADATA_REF);
  await hook.release();
  assert.deepEqual(await alphaPushed, { pushed: true, message: "pushed to main" });
  return { betasRecord, pushes: await hook.pushes() };
}

test("two volumes on one branch race: the loser rebases once and pushes once more, its commits, its record on the other's and its owner ref together", async (t) => {
  const remote = await servedRemote(t);
  const alpha = await stage(t, remote, "alpha", "main");
  const beta = await stage(t, remote, "beta", "main");
  const [alphaFile, betaFile] = [await write(alpha), await write(beta)];
  const { betasRecord, pushes } = await race(remote, alpha, beta);

  // One fetch told alpha that main and the metadata ref both moved: no push went out that could only be refused again.
  assert.equal(rejections(alpha).length, 1, JSON.stringify(rejections(alpha)));
  assert.equal(events(alpha, "GitVolumeRebased"), 1);
  assert.equal(alpha.sync.report().sideBranch, "");
  assert.equal(remote.git("show", `main:${alphaFile}`), "alpha");
  assert.equal(remote.git("show", `main:${betaFile}`), "beta");
  // Alpha recorded on top of beta's record, never over it.
  remote.git("merge-base", "--is-ancestor", betasRecord, METADATA_REF);
  assert.equal(recordedMode(remote, "main", alphaFile), 0o600);
  assert.equal(recordedMode(remote, "main", betaFile), 0o600);
  const alphas = pushes.filter((refs) => refs.includes("refs/git-csi/owner/alpha"));
  assert.equal(alphas.length, 2, "the refused push and the one that landed");
  for (const refs of alphas) assert.deepEqual([...refs].sort(), [METADATA_REF, "refs/git-csi/owner/alpha", "refs/heads/main"]);
});

test("a push refused only because another branch's volume recorded on the metadata ref records again on it: no rebase, no side branch", async (t) => {
  const remote = await servedRemote(t);
  remote.git("update-ref", "refs/heads/other", "refs/heads/main");
  const alpha = await stage(t, remote, "alpha", "main");
  const beta = await stage(t, remote, "beta", "other");
  const [alphaFile, betaFile] = [await write(alpha), await write(beta)];
  const main = remote.git("rev-parse", "main");
  const { betasRecord, pushes } = await race(remote, alpha, beta);

  assert.equal(rejections(alpha).length, 1);
  assert.equal(rejections(alpha)[0]!.rebases, 0);
  assert.equal(events(alpha, "GitVolumeRebased"), 0, "main never moved: nothing to rebase");
  assert.equal(alpha.sync.report().sideBranch, "");
  assert.equal(remote.git("rev-parse", "main^"), main, "alpha's commit sits right on the main it started from");
  remote.git("merge-base", "--is-ancestor", betasRecord, METADATA_REF);
  assert.equal(recordedMode(remote, "main", alphaFile), 0o600);
  assert.equal(recordedMode(remote, "other", betaFile), 0o600);
  assert.equal(pushes.filter((refs) => refs.includes("refs/git-csi/owner/alpha")).length, 2);
});
