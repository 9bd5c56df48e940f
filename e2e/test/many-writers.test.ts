import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { createVolume, type Driver, setVolumeClass, sh, stageAndPublish, unpublishAndUnstage } from "../src/driver";
import type { GitServer } from "../src/git-server";
import { withDaemonAndDriver } from "../src/fixtures";

const WRITES = 200;
const UPSTREAM_COMMITS = 20;

describe("many writers on one repository", () => {
  let server: GitServer;
  let driver: Driver;

  withDaemonAndDriver((s, d) => {
    server = s;
    driver = d;
  });

  test(`two volumes, each writing its own directory ${WRITES} times while a person pushes upstream: every write lands, no side branch`, async () => {
    await server.createRepo("shared.git", { files: { "README.md": "configs\n" } });
    const volumes = [];
    for (const app of ["homeassistant", "nodered"]) {
      const volume = await stageAndPublish(driver, await createVolume(driver, app, server.url("shared.git")), undefined, app);
      await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1s", "push.maxLatency": "3s" });
      volumes.push({ app, volume });
    }
    // Each application writes under its own directory, as with subPath; the last write of a file wins.
    const writers = volumes.map(({ app, volume }) =>
      sh(
        `mkdir -p '${volume.targetPath}/${app}' && for i in $(seq 1 ${WRITES}); do echo "write $i" > '${volume.targetPath}/${app}/f'$((i % 50)).txt; echo "write $i" >> '${volume.targetPath}/${app}/log.txt'; sleep 0.05; done`,
      ),
    );
    const person = (async () => {
      for (let i = 0; i < UPSTREAM_COMMITS; i++) {
        // Like a person whose push was refused because a volume pushed first: try again on top.
        for (let tries = 0; ; tries++) {
          const landed = await server.commitFiles("shared.git", { [`upstream/${i}.txt`]: `${i}\n` }, { message: `a person's commit ${i}` }).then(
            () => true,
            (err: Error) => {
              if (tries > 20 || !/cannot lock ref/.test(err.message)) throw err;
              return false;
            },
          );
          if (landed) break;
        }
        await sleep(1000);
      }
    })();
    await Promise.all([...writers, person]);
    for (const { volume } of volumes) await unpublishAndUnstage(driver, volume);

    if (process.env.GIT_CSI_DEBUG) {
      const lines = driver
        .logs()
        .split("\n")
        .filter((l) => /"volume":"(homeassistant|nodered)"/.test(l) && /Pushed|Rebased|committed|failed|rejected|Diverged/.test(l));
      console.error(
        lines
          .map((l) => {
            const j = JSON.parse(l) as Record<string, string>;
            return `${j.timestamp} ${j.volume} ${j.message} ${String(j.detail ?? "").slice(0, 250)}`;
          })
          .join("\n"),
      );
      console.error(await server.git("shared.git", "log", "--format=%h %p %s", "main"));
    }
    const files = new Set((await server.git("shared.git", "ls-tree", "-r", "--name-only", "main")).split("\n"));
    for (let i = 0; i < UPSTREAM_COMMITS; i++) assert.ok(files.has(`upstream/${i}.txt`), `upstream/${i}.txt`);
    for (const { app } of volumes) {
      const log = await server.git("shared.git", "show", `main:${app}/log.txt`);
      assert.deepEqual(
        log.split("\n"),
        Array.from({ length: WRITES }, (_, i) => `write ${i + 1}`),
        `${app}/log.txt holds every write in order`,
      );
      for (let i = 0; i < 50; i++) {
        const last = Math.max(...Array.from({ length: WRITES }, (_, k) => k + 1).filter((k) => k % 50 === i));
        assert.equal(await server.git("shared.git", "show", `main:${app}/f${i}.txt`), `write ${last}`);
      }
    }
    const branches = (await server.git("shared.git", "for-each-ref", "--format=%(refname)", "refs/heads/")).split("\n");
    assert.deepEqual(branches, ["refs/heads/main"], "no side branch");
    const subjects = await server.git("shared.git", "log", "--format=%s", "main");
    assert.equal(subjects.split("\n").filter((s) => s.startsWith("a person's commit")).length, UPSTREAM_COMMITS, "no upstream commit lost");
    assert.match(driver.logs(), /"reason":"GitVolumeRebased"/);
  });
});
