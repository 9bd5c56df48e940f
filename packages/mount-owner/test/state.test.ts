import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test, type TestContext } from "node:test";
import { status } from "@grpc/grpc-js";
import { CsiError, gitcsi, mountOwner } from "@git-csi/protos";
import { State, type VolumeRecord } from "../src/state";

async function state(t: TestContext): Promise<State> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-state-"));
  t.after(() => fs.rm(dir, { recursive: true, force: true }));
  return new State(dir);
}

/** The files under the state directory with their contents: what a refused step must leave as it was. */
async function snapshot(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await fs.readdir(dir, { recursive: true, withFileTypes: true }).catch(() => [])) {
    if (entry.isFile()) out[path.relative(dir, path.join(entry.parentPath, entry.name))] = await fs.readFile(path.join(entry.parentPath, entry.name), "utf8");
  }
  return out;
}

const code = (expected: status, fragment: string) => (err: unknown) => err instanceof CsiError && err.code === expected && err.message.includes(fragment);

const record: VolumeRecord = { volumeId: "vol", source: { url: "https://git.example/r.git", ref: "main" }, accessMode: gitcsi.AccessMode.READ_WRITE_ONCE, targets: [] };
const volume: mountOwner.Volume = {
  volumeId: "vol",
  name: "vol",
  capacityBytes: 0,
  source: record.source,
  accessMode: record.accessMode,
  classParameters: {},
  baseRef: "",
  onDelete: gitcsi.OnDelete.ON_DELETE_KEEP,
};

test("CreateVolume's record: the same request again answers the same volume, another one is AlreadyExists and changes nothing", async (t) => {
  const s = await state(t);
  assert.deepEqual(await s.createVolume(volume), { volume, created: true });
  // A record read back is the message with every field, unset ones included.
  assert.deepEqual(await s.createVolume(volume), { volume: mountOwner.Volume.fromPartial(volume), created: false });
  const before = await snapshot(s.stateDir);
  await assert.rejects(s.createVolume({ ...volume, capacityBytes: 1 }), code(status.ALREADY_EXISTS, "volume vol exists with other capacity"));
  await assert.rejects(s.createVolume({ ...volume, contentSource: { snapshotId: "snap-1", volumeId: "" } }), code(status.ALREADY_EXISTS, "volume vol exists with other"));
  assert.deepEqual(await snapshot(s.stateDir), before);
});

test("a volume neither created nor staged is NotFound; a staged one is known by its node record", async (t) => {
  const s = await state(t);
  await assert.rejects(s.knownVolume("vol"), code(status.NOT_FOUND, "volume vol does not exist"));
  await s.recordStaged({ ...record, stagingPath: "/staging/vol", volumeClass: { name: "c", parameters: { "push.quiesce": "5s" } } });
  assert.deepEqual(await s.knownVolume("vol"), { ...volume, classParameters: { "push.quiesce": "5s" } });
});

test("publish and unpublish keep the targets and their pods; the unstage keeps the record without its staging path", async (t) => {
  const s = await state(t);
  await s.recordStaged({ ...record, stagingPath: "/staging/vol" });
  const pod = { namespace: "apps", name: "app-0", uid: "u" };
  await s.recordPublished("vol", "/pods/a", { "/pods/a": pod });
  await s.recordPublished("vol", "/pods/a", { "/pods/a": pod });
  assert.deepEqual((await s.volume("vol"))?.targets, ["/pods/a"]);
  await assert.rejects(s.checkUnpublished("vol"), code(status.FAILED_PRECONDITION, "still published at /pods/a"));
  assert.equal(await s.recordUnpublished("vol", "/pods/other"), undefined);
  assert.deepEqual(await s.recordUnpublished("vol", "/pods/a"), { ...record, stagingPath: "/staging/vol", targets: [], pods: {} });
  await s.recordUnstaged("vol");
  assert.equal((await s.volume("vol"))?.stagingPath, undefined);
});

test("a staged volume is not deleted; an unstaged one moves to the deletions until its tree is gone", async (t) => {
  const s = await state(t);
  await s.createVolume(volume);
  await s.recordStaged({ ...record, stagingPath: "/staging/vol" });
  const before = await snapshot(s.stateDir);
  await assert.rejects(s.recordDeleted("vol"), code(status.FAILED_PRECONDITION, "staged at /staging/vol; unstage it before deleting it"));
  assert.deepEqual(await snapshot(s.stateDir), before);
  await s.recordUnstaged("vol");
  assert.equal(await s.recordDeleted("vol"), true);
  assert.deepEqual([await s.volume("vol"), await s.provisionedVolume("vol"), await s.deletedVolumeIds()], [undefined, undefined, ["vol"]]);
  await s.forgetDeleted("vol");
  assert.deepEqual(await s.deletedVolumeIds(), []);
  assert.equal(await s.recordDeleted("vol"), false);
});

test("a record the node cannot read is Internal, naming its file; it is not taken for an absent one", async (t) => {
  const s = await state(t);
  await fs.mkdir(path.join(s.stateDir, "volumes"), { recursive: true });
  const file = path.join(s.stateDir, "volumes", "vol.json");
  await fs.writeFile(file, "{ half a record");
  await assert.rejects(s.volume("vol"), code(status.INTERNAL, `${file} is not a readable record`));
});
