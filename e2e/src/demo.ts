// make demo: the driver's main job on this machine, with no cluster — a real
// git server, the three services as real processes, a real FUSE mount.
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { createVolume, mountsUnder, sh, stageAndPublish, startDriver, unpublishAndUnstage } from "./driver";
import { startGitDaemon } from "./git-server";

const say = (text: string) => process.stdout.write(`\n== ${text}\n`);

async function main(): Promise<void> {
  say("starting a local git server (git daemon) with a new repository");
  const server = await startGitDaemon();
  await server.createRepo("homeassistant.git", { files: { "configuration.yaml": "homeassistant:\n  name: Home\n", ".gitignore": "*.db\n" } });
  process.stdout.write(`repository: ${server.url("homeassistant.git")}\n`);

  say("starting git-worker, mount-owner and csi-frontend (git-csi standalone)");
  const driver = await startDriver({ nodeId: "demo-node" });
  process.stdout.write(`CSI socket: ${driver.endpoint}\n`);
  for (const service of ["git-worker", "mount-owner", "csi-frontend"] as const) process.stdout.write(`  ${service} pid ${await driver.pid(service)}\n`);
  try {
    say("CreateVolume, NodeStageVolume, NodePublishVolume over the CSI socket");
    const volume = await createVolume(driver, "homeassistant-config", server.url("homeassistant.git"));
    const published = await stageAndPublish(driver, volume);
    process.stdout.write(`staged (FUSE) at ${published.stagingPath}\npublished at ${published.targetPath}\n`);

    say("the application (another process) lists its directory and writes a file");
    process.stdout.write(await sh(`ls -la '${published.targetPath}'`));
    await sh(`printf 'automation:\\n  - alias: lights on at sunset\\n' > '${published.targetPath}/automations.yaml'`);
    process.stdout.write(await sh(`cat '${published.targetPath}/automations.yaml'`));

    say("the file is in the volume's work tree, a git clone the node keeps");
    const tree = path.join(driver.stateDir, "trees", volume.volumeId);
    process.stdout.write(`${tree}/automations.yaml:\n${await fs.readFile(path.join(tree, "automations.yaml"), "utf8")}`);

    say("tearing down: NodeUnpublishVolume, NodeUnstageVolume");
    await unpublishAndUnstage(driver, published);
    const left = await mountsUnder(driver.dir);
    process.stdout.write(left.length === 0 ? "no mounts left\n" : `mounts left: ${left.join(", ")}\n`);
    if (left.length > 0) process.exitCode = 1;
  } finally {
    await driver.stop();
    await server.stop();
    await fs.rm(driver.dir, { recursive: true, force: true });
  }
  say("done: services stopped, git server stopped");
}

main().catch((err: unknown) => {
  process.stderr.write(`demo failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
