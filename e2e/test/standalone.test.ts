import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import { csi } from "@git-csi/protos";
import { freePort, modifyVolume, report, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { startGitDaemon } from "../src/git-server";

/**
 * Standalone mode, as `make demo` and the README's no-cluster section run it:
 * ControllerModifyVolume arms any volume the node has staged, a static one
 * that CreateVolume never made included, and still answers NotFound for a
 * volume the node knows nothing of.
 */
test("standalone: ControllerModifyVolume arms a static volume staged over the CSI socket", async (t) => {
  const server = await startGitDaemon();
  const driver = await startDriver({ metricsPort: await freePort() });
  t.after(async () => {
    await driver.stop();
    await server.stop();
  });
  await server.createRepo("static.git", { files: { "README.md": "static\n" } });
  const volume = csi.Volume.fromPartial({ volumeId: "static-volume", volumeContext: { url: server.url("static.git"), ref: "main" } });

  await assert.rejects(
    modifyVolume(driver, "static-volume", { "push.quiesce": "1s" }),
    (err: { code: number; message: string }) => err.code === status.NOT_FOUND && /static-volume does not exist/.test(err.message),
  );

  const published = await stageAndPublish(driver, volume);
  assert.equal((await report(driver, "static-volume")).armed, false);
  await modifyVolume(driver, "static-volume", { "push.quiesce": "1s", "commit.author": "Static <static@example.com>" });
  await waitFor("the static volume armed", async () => (await report(driver, "static-volume")).armed);
  await fs.writeFile(path.join(published.targetPath, "written.txt"), "pushed\n");
  const pushed = await waitFor("written.txt pushed", () => server.git("static.git", "show", "main:written.txt").catch(() => undefined));
  assert.equal(pushed, "pushed");
  assert.equal((await server.git("static.git", "log", "-1", "--format=%an <%ae>", "main")).trim(), "Static <static@example.com>");

  // A second modification keeps the parameters it does not name: the author stays.
  await modifyVolume(driver, "static-volume", { "push.maxLatency": "2m" });
  await fs.writeFile(path.join(published.targetPath, "second.txt"), "second\n");
  await waitFor("second.txt pushed", () => server.git("static.git", "show", "main:second.txt").catch(() => undefined));
  assert.equal((await server.git("static.git", "log", "-1", "--format=%an <%ae>", "main")).trim(), "Static <static@example.com>");
  await unpublishAndUnstage(driver, published);
});
