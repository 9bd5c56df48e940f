import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { describe, test } from "node:test";
import { createVolume, deleteVolume, type Driver, nodeRepo, report, setVolumeClass, sh, stageAndPublish, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitServer, preReceive, runGit } from "../src/git-server";
import { withDaemonAndDriver } from "../src/fixtures";

const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };

describe("work trees the node keeps", () => {
  let server: GitServer;
  let driver: Driver;

  withDaemonAndDriver((s, d) => {
    server = s;
    driver = d;
  });

  const trees = async () => fs.readdir(path.join(driver.stateDir, "trees")).catch(() => [] as string[]);
  const repos = async () => fs.readdir(path.join(driver.stateDir, "repos")).catch(() => [] as string[]);

  test("Delete removes the tree, says it held a commit no push sent, and never touches the remote", async () => {
    await server.createRepo("deleted.git");
    const volume = await stageAndPublish(driver, await createVolume(driver, "to-delete", server.url("deleted.git")));
    await setVolumeClass(driver, volume.volumeId, FAST);
    const hook = await preReceive(server, "deleted.git", "#!/bin/sh\nexit 1\n");
    await sh(`echo lost > '${volume.targetPath}/lost.txt'`);
    await waitFor("a failed push", async () => (await report(driver, volume.volumeId)).pushFailures > 0);
    await unpublishAndUnstage(driver, volume);
    await fs.rm(hook);
    const remoteBefore = await server.git("deleted.git", "for-each-ref");
    assert.ok((await trees()).includes("to-delete"), "unstage keeps the tree");

    await deleteVolume(driver, "to-delete");
    assert.ok(!(await trees()).includes("to-delete"));
    assert.match(driver.logs(), /removed the work tree [^"]*to-delete; it held 1 commit\(s\) no push sent/);
    assert.equal(await server.git("deleted.git", "for-each-ref"), remoteBefore, "the remote is never deleted or changed");
    await deleteVolume(driver, "to-delete");
  });

  test("a git worker that is down when the volume is deleted removes its tree when it answers again", async () => {
    await server.createRepo("while-down.git");
    const volume = await stageAndPublish(driver, await createVolume(driver, "deleted-while-down", server.url("while-down.git")));
    await unpublishAndUnstage(driver, volume);
    const worker = await driver.pid("git-worker");
    process.kill(worker, "SIGSTOP");
    try {
      await deleteVolume(driver, "deleted-while-down");
      assert.ok((await trees()).includes("deleted-while-down"), "the tree waits for the worker");
      assert.match(driver.logs(), /the tree of deleted volume deleted-while-down stays until the git worker answers/);
    } finally {
      process.kill(worker, "SIGCONT");
    }
    await waitFor("the tree removed and the deletion done", async () => !(await trees()).includes("deleted-while-down") && (await fs.readdir(path.join(driver.stateDir, "deletions"))).length === 0);
  });

  test("a staged volume is not deleted", async () => {
    await server.createRepo("busy.git");
    const volume = await stageAndPublish(driver, await createVolume(driver, "busy", server.url("busy.git")));
    await assert.rejects(deleteVolume(driver, "busy"), /volume busy is staged at .*; unstage it before deleting it/);
    assert.ok((await trees()).includes("busy"));
    await unpublishAndUnstage(driver, volume);
    await deleteVolume(driver, "busy");
  });

  test("after each removal: refs no volume follows go, a repository no tree names goes, the rest are collected", async () => {
    await server.createRepo("two.git");
    const a = await stageAndPublish(driver, await createVolume(driver, "two-a", server.url("two.git")), undefined, "two-a");
    const b = await stageAndPublish(driver, await createVolume(driver, "two-b", server.url("two.git")), undefined, "two-b");
    await server.commitFiles("two.git", { "x.txt": "x\n" }, { branch: "other" });
    const gitDir = await nodeRepo(driver, server.url("two.git"));
    // A ref that no volume follows, as a volume of another branch would have left it.
    await runGit(["--git-dir", gitDir, "fetch", "-q", "origin", "+refs/heads/other:refs/git-csi/upstream/heads/other"]);
    await unpublishAndUnstage(driver, a);
    await unpublishAndUnstage(driver, b);
    await deleteVolume(driver, "two-a");
    const refs = (await runGit(["--git-dir", gitDir, "for-each-ref", "--format=%(refname)", "refs/git-csi/upstream/heads/"])).trim().split("\n");
    assert.deepEqual(refs, ["refs/git-csi/upstream/heads/main"], "only the ref two-b follows stays");
    assert.match(driver.logs(), /"message":"collected [^"]*"/);
    await deleteVolume(driver, "two-b");
    assert.ok(!(await repos()).includes(path.basename(gitDir)), "no tree names the repository any more");
    assert.match(driver.logs(), /removed the bare repository [^"]*: no work tree or read-only volume follows it/);
  });
});
