import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { gitcsi } from "@git-csi/protos";
import { newSession, readSession, removeSession, sessionPath, writeSession } from "../src/session";

async function staging(): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-session-"));
  await fs.mkdir(path.join(dir, "globalmount"));
  return path.join(dir, "globalmount");
}

const base = { volumeId: "vol", node: "node-a", endpoints: { mountOwner: "unix:///run/mo.sock", gitWorker: "unix:///run/gw.sock" }, accessMode: gitcsi.AccessMode.READ_WRITE_ONCE };

const identity = { volumeId: "vol", node: "node-a", accessMode: gitcsi.AccessMode.READ_WRITE_ONCE };

test("the record is written beside the staging directory, mode 0600, and read back", async () => {
  const stagingPath = await staging();
  const record = newSession(base, 4);
  assert.equal(record.generation, 5);
  assert.equal(record.completed, false);
  await writeSession(stagingPath, record);
  assert.equal(sessionPath(stagingPath), `${stagingPath}.rwo-session`);
  assert.equal((await fs.stat(sessionPath(stagingPath))).mode & 0o777, 0o600);
  assert.deepEqual(await readSession(stagingPath, identity), record);
  // A retry's read finds the same epoch; no temporary file is left beside it.
  assert.deepEqual((await fs.readdir(path.dirname(stagingPath))).sort(), ["globalmount", "globalmount.rwo-session"]);
  await removeSession(stagingPath);
  assert.equal(await readSession(stagingPath, identity), undefined);
});

test("a symlink, another volume's, node's or access mode's record, a torn record and a wrong mode are refused", async () => {
  const stagingPath = await staging();
  const file = sessionPath(stagingPath);
  const elsewhere = path.join(path.dirname(stagingPath), "elsewhere");
  await writeSession(path.join(path.dirname(stagingPath), "other"), newSession(base, 0));
  await fs.rename(`${path.join(path.dirname(stagingPath), "other")}.rwo-session`, elsewhere);
  await fs.symlink(elsewhere, file);
  await assert.rejects(readSession(stagingPath, identity), /\.rwo-session is a symlink; the stage of volume vol cannot continue its session/);
  await fs.rm(file);

  await writeSession(stagingPath, newSession({ ...base, volumeId: "another" }, 0));
  await assert.rejects(readSession(stagingPath, identity), /belongs to another volume/);
  await writeSession(stagingPath, newSession({ ...base, node: "node-b" }, 0));
  await assert.rejects(readSession(stagingPath, identity), /belongs to node node-b, not node-a/);
  await writeSession(stagingPath, newSession({ ...base, accessMode: gitcsi.AccessMode.READ_WRITE_ONCE_POD }, 0));
  await assert.rejects(readSession(stagingPath, identity), /was written for another access mode/);
  // The unstage names no access mode: the record's is taken as it is.
  assert.equal((await readSession(stagingPath, { volumeId: "vol", node: "node-a" }))?.node, "node-a");

  const whole = JSON.stringify(newSession(base, 0));
  await fs.writeFile(file, whole.slice(0, whole.length / 2), { mode: 0o600 });
  await assert.rejects(readSession(stagingPath, identity), /cannot be read as a session record/);

  await writeSession(stagingPath, newSession(base, 0));
  await fs.chmod(file, 0o644);
  await assert.rejects(readSession(stagingPath, identity), /has mode 644, not 600/);
});
