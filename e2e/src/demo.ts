// make demo: the driver's main job on this machine, with no cluster — a real
// git server, the three services as real processes, a real FUSE mount.
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { createVolume, freePort, modifyVolume, mountsUnder, report, sh, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "./driver";
import { startGitDaemon } from "./git-server";

const say = (text: string) => process.stdout.write(`\n== ${text}\n`);

async function main(): Promise<void> {
  say("starting a local git server (git daemon) with a new repository");
  const server = await startGitDaemon();
  await server.createRepo("homeassistant.git", { files: { "configuration.yaml": "homeassistant:\n  name: Home\n", ".gitignore": "*.db\n" } });
  process.stdout.write(`repository: ${server.url("homeassistant.git")}\n`);

  say("starting git-worker, mount-owner and csi-frontend (git-csi standalone)");
  const driver = await startDriver({ nodeId: "demo-node", metricsPort: await freePort() });
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

    say("the file is in the volume's work tree, a git clone the node keeps; unarmed, nothing is committed yet");
    const tree = path.join(driver.stateDir, "trees", volume.volumeId);
    process.stdout.write(`${tree}/automations.yaml:\n${await fs.readFile(path.join(tree, "automations.yaml"), "utf8")}`);
    const unarmed = await waitFor("the write to be reported", async () => {
      const r = await report(driver, volume.volumeId);
      return r.pendingPaths.length > 0 && r;
    });
    process.stdout.write(`armed: ${unarmed.armed}; would commit: ${unarmed.pendingPaths.join(", ")}\n`);

    say("ControllerModifyVolume arms the volume with a class: quiesce 2s, files up to 1Mi, an author");
    await modifyVolume(driver, volume.volumeId, {
      "push.quiesce": "2s",
      "push.maxLatency": "1m",
      "commit.maxFileSize": "1Mi",
      "commit.author": "Home Assistant <homeassistant@home.example>",
    });
    const t = published.targetPath;
    await sh(
      `chmod 0600 '${t}/automations.yaml' && mkdir -p '${t}/blueprints' '${t}/backups' && echo data > '${t}/home-assistant_v2.db' && head -c 2097152 /dev/urandom > '${t}/backups/snapshot.tar'`,
    );
    process.stdout.write("made automations.yaml 0600, an empty blueprints/ directory, a database (*.db is in .gitignore) and a 2 MiB backup\n");
    await waitFor("the push", async () => (await server.git("homeassistant.git", "log", "-1", "--format=%s", "main")).includes("path(s)"));

    say("the remote holds the commit, by the class's author");
    process.stdout.write(`${await server.git("homeassistant.git", "log", "-1", "--format=%h %an <%ae>%n%s%n%b", "main")}\n`);
    process.stdout.write(`files on main: ${(await server.git("homeassistant.git", "ls-tree", "-r", "--name-only", "main")).split("\n").join(", ")}\n`);

    say("modes, owners and empty directories are on refs/git-csi/metadata, not in the tree");
    await waitFor("the metadata ref", async () => (await server.git("homeassistant.git", "rev-parse", "--verify", "--quiet", "refs/git-csi/metadata").catch(() => "")) !== "");
    const listings = (await server.git("homeassistant.git", "ls-tree", "-r", "--name-only", "refs/git-csi/metadata")).split("\n");
    for (const listing of listings) process.stdout.write(`${listing}:\n${await server.git("homeassistant.git", "show", `refs/git-csi/metadata:${listing}`)}\n`);

    say("the large file is skipped and named");
    const armed = await report(driver, volume.volumeId);
    process.stdout.write(`skipped: ${armed.skippedPaths.join(", ")}\n`);
    for (const event of armed.recentEvents) process.stdout.write(`${event.type.padEnd(7)} ${event.reason}: ${event.message}\n`);

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
