import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { call } from "@git-csi/protos";
import { createVolume, type Driver, mountsUnder, sh, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

/** An application in its own process: appends numbered lines, fsyncing each, and reports every error it meets. */
const WRITER = `
import os, sys, time
path, count = sys.argv[1], int(sys.argv[2])
errors = 0
with open(path, "a") as f:
    for i in range(count):
        try:
            f.write("line %d\\n" % i); f.flush(); os.fsync(f.fileno())
        except OSError as e:
            errors += 1; print("error", e, file=sys.stderr)
        time.sleep(0.004)
print(errors)
sys.exit(1 if errors else 0)
`;

describe("the split-service layout", () => {
  let server: GitServer;
  let driver: Driver;

  before(async () => {
    server = await startGitDaemon();
    await server.createRepo("app.git");
    // A short lease, so the frontend's absence spans more than a whole lease.
    driver = await startDriver({ lease: { duration: "3s", renewInterval: "1s" } });
  });

  after(async () => {
    await driver?.stop();
    await server?.stop();
  });

  /** The volume's owner record on the remote, as fields. */
  async function ownerRecord(volumeId: string): Promise<Record<string, string>> {
    const text = await server.git("app.git", "show", "-s", "--format=%B", `refs/git-csi/owner/${volumeId}`);
    return Object.fromEntries([...text.matchAll(/^([a-z-]+): (\S+)/gm)].map((m) => [m[1]!, m[2]!]));
  }

  test("SIGKILL of csi-frontend while an application writes leaves the mount serving and renewing its lease, and a new frontend answers at once", async () => {
    const volume = await createVolume(driver, "replace-frontend", server.url("app.git"));
    const published = await stageAndPublish(driver, volume);
    const lines = 1500;
    const writer = spawn("python3", ["-c", WRITER, path.join(published.targetPath, "log.txt"), String(lines)], { stdio: ["ignore", "pipe", "pipe"] });
    let writerErr = "";
    writer.stderr.on("data", (c: Buffer) => (writerErr += c.toString()));
    const writerDone = new Promise<number>((resolve) => writer.once("exit", (code) => resolve(code ?? 1)));

    await sleep(800);
    const oldPid = await driver.pid("csi-frontend");
    process.kill(oldPid, "SIGKILL");
    const killedAt = Date.now();
    const newPid = await waitFor("a new frontend", async () => {
      const pid = await driver.pid("csi-frontend");
      return pid !== oldPid && pid;
    });
    const probe = await waitFor("the new frontend to answer Probe", async () => {
      const answer = await call(driver.identity.probe.bind(driver.identity), {}, 1000);
      return answer.ready && answer;
    });
    assert.equal(probe.ready, true);
    assert.notEqual(newPid, oldPid);
    assert.ok(Date.now() - killedAt < 15_000, "the replacement answered");
    // Kill it again and again while the writer goes on, for longer than a lease: the mount owner renews without it.
    for (let i = 0; i < 4; i++) {
      await sleep(1000);
      process.kill(await driver.pid("csi-frontend"), "SIGKILL");
    }

    assert.equal(await writerDone, 0, `the writer met errors: ${writerErr}`);
    assert.equal(writerErr, "");
    const record = await ownerRecord(volume.volumeId);
    assert.equal(record.released, "false");
    assert.ok(Number(record.expires) > killedAt + 4000 + 3000, "renewals went on while the frontend was away");
    const written = await fs.readFile(path.join(driver.stateDir, "trees", volume.volumeId, "log.txt"), "utf8");
    assert.deepEqual(
      written.split("\n").filter(Boolean),
      Array.from({ length: lines }, (_, i) => `line ${i}`),
    );
    assert.equal(await sh(`wc -l < '${published.targetPath}/log.txt'`), `${lines}\n`);

    // The mount owner and its mounts were never touched.
    assert.equal((await mountsUnder(driver.dir)).length, 2);
    // A client reconnects to the last replacement as the kubelet does: by trying again.
    await waitFor("the last frontend to answer Probe", async () => (await call(driver.identity.probe.bind(driver.identity), {}, 1000)).ready);
    await unpublishAndUnstage(driver, published);
    assert.deepEqual(await mountsUnder(driver.dir), []);
  });

  test("after the mount owner and the descriptor keeper die together, unpublish and unstage clear the dead mounts, and a new stage serves", async () => {
    const volume = await createVolume(driver, "restart-owner", server.url("app.git"));
    const published = await stageAndPublish(driver, volume);
    await sh(`echo before > '${published.targetPath}/kept.txt'`);
    const epoch = (await ownerRecord(volume.volumeId)).epoch;
    const oldPid = await driver.pid("mount-owner");
    // With no process left holding the connection's descriptor, the kernel ends it.
    process.kill(await driver.pid("fd-keeper"), "SIGKILL");
    process.kill(oldPid, "SIGKILL");
    await waitFor("a new mount owner", async () => (await driver.pid("mount-owner")) !== oldPid);
    await waitFor("Probe ready", async () => (await call(driver.identity.probe.bind(driver.identity), {}, 1000)).ready);
    // The dead FUSE connection is still in the kernel's table.
    await assert.rejects(sh(`ls '${published.targetPath}'`), /Transport endpoint is not connected/);

    await unpublishAndUnstage(driver, published);
    await unpublishAndUnstage(driver, published);
    assert.deepEqual(await mountsUnder(driver.dir), []);
    // The unstage released the epoch the .rwo-session record kept across the restart.
    assert.deepEqual([(await ownerRecord(volume.volumeId)).epoch, (await ownerRecord(volume.volumeId)).released], [epoch, "true"]);

    const again = await stageAndPublish(driver, volume);
    assert.notEqual((await ownerRecord(volume.volumeId)).epoch, epoch, "a fresh stage serves with a new epoch");
    assert.equal(await sh(`cat '${again.targetPath}/kept.txt'`), "before\n");
    await unpublishAndUnstage(driver, again);
    assert.deepEqual(await mountsUnder(driver.dir), []);
  });
});
