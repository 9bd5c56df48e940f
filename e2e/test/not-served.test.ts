import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { describe, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { orAbsent } from "@git-csi/config";
import { call, csi, CsiError } from "@git-csi/protos";
import { createVolume, type Driver, mountCapability, report, setVolumeClass, sh, stageAndPublish, unpublishAndUnstage, waitFor } from "../src/driver";
import { LFS_ATTRIBUTES, LFS_POINTER, withDaemonAndDriver } from "../src/fixtures";
import { type GitServer, runGit } from "../src/git-server";

const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };

/**
 * Spec 004, "What the driver does not serve": a checkout is one ref of one
 * repository. A submodule's directory is empty, a Git LFS pointer file is
 * checked out as the pointer and not the object it names, and a writeable
 * volume takes no depth.
 */
describe("what the driver does not serve", () => {
  let server: GitServer;
  let driver: Driver;
  withDaemonAndDriver((s, d) => ([server, driver] = [s, d]));

  /** What the remote holds at a path of main, or undefined. */
  const remoteFile = (repo: string, file: string) => server.git(repo, "show", `main:${file}`).catch(() => undefined);

  async function published(repo: string, volumeId: string, context: Record<string, string> = {}) {
    const created = await createVolume(driver, volumeId, server.url(repo));
    return stageAndPublish(driver, { ...created, volumeContext: { ...created.volumeContext, ...context } }, undefined, volumeId);
  }

  test("a submodule's directory is empty; a file written into it is not committed and is named in a Warning, and the volume's other writes are pushed", async () => {
    const libCommit = await server.createRepo("lib.git", { files: { "lib.c": "int lib;\n" } });
    await server.createRepo("superproject.git", { files: { ".gitmodules": `[submodule "vendor/lib"]\n\tpath = vendor/lib\n\turl = ${server.url("lib.git")}\n` } });
    await server.commitFiles("superproject.git", { "README.md": "app\n" }, { gitlinks: { "vendor/lib": libCommit } });
    const volume = await published("superproject.git", "submodule");
    const dir = path.join(volume.targetPath, "vendor", "lib");
    assert.ok((await fs.stat(dir)).isDirectory());
    assert.deepEqual(await fs.readdir(dir), []);

    await armAndWrite(volume.volumeId, `echo inside > '${dir}/lib.h' && echo notes > '${volume.targetPath}/notes.txt'`);
    await waitFor("notes.txt pushed", () => remoteFile("superproject.git", "notes.txt"));
    const warning = await waitFor("the Warning", async () => (await report(driver, volume.volumeId)).recentEvents.find((e) => e.reason === "GitVolumeNotServed"));
    assert.equal(warning.type, "Warning");
    assert.equal(warning.message, "vendor/lib/lib.h is inside the submodule vendor/lib, which the driver does not serve: it is not committed");
    // The superproject's commit keeps the gitlink as it was; the file stays in the tree, uncommitted.
    assert.equal(await server.git("superproject.git", "ls-tree", "-r", "main", "vendor"), `160000 commit ${libCommit}\tvendor/lib`);
    assert.equal(await fs.readFile(path.join(dir, "lib.h"), "utf8"), "inside\n");
    // Nor does refs/git-csi/metadata record it, beside the files it does record.
    const recorded = await server.git("superproject.git", "log", "-p", "refs/git-csi/metadata");
    assert.ok(recorded.includes('"name":"notes.txt"') && !recorded.includes("lib.h"), recorded);
    await unpublishAndUnstage(driver, volume);
  });

  test("a Git LFS pointer file is served as the pointer, not the object it names", async () => {
    await server.createRepo("lfs.git", { files: { ".gitattributes": LFS_ATTRIBUTES, "floorplan.bin": LFS_POINTER } });
    const volume = await published("lfs.git", "lfs-read");
    assert.equal(await fs.readFile(path.join(volume.targetPath, "floorplan.bin"), "utf8"), LFS_POINTER);
    assert.equal((await fs.stat(path.join(volume.targetPath, "floorplan.bin"))).size, Buffer.byteLength(LFS_POINTER));
    await unpublishAndUnstage(driver, volume);
  });

  test("a Git LFS pointer the application edits is committed as written, with a Warning naming the file", async () => {
    await server.createRepo("lfs-edit.git", { files: { ".gitattributes": LFS_ATTRIBUTES, "floorplan.bin": LFS_POINTER, "notes.txt": "a\n" } });
    const volume = await published("lfs-edit.git", "lfs-edit");
    await armAndWrite(volume.volumeId, `printf 'the real floor plan' > '${volume.targetPath}/floorplan.bin' && echo b > '${volume.targetPath}/notes.txt'`);
    await waitFor("floorplan.bin pushed", async () => (await remoteFile("lfs-edit.git", "floorplan.bin")) === "the real floor plan");
    assert.equal(await remoteFile("lfs-edit.git", "notes.txt"), "b");
    const warnings = (await report(driver, volume.volumeId)).recentEvents.filter((e) => e.reason === "GitVolumeNotServed");
    assert.deepEqual(
      warnings.map((e) => [e.type, e.message]),
      [
        [
          "Warning",
          "floorplan.bin is a Git LFS file (filter=lfs in .gitattributes), which the driver does not serve: it is committed as the application wrote it, as an ordinary blob, not as an LFS object",
        ],
      ],
    );
    await unpublishAndUnstage(driver, volume);
  });

  test("a writeable volume takes no depth: the tree's repository holds the remote's whole history", async () => {
    await server.createRepo("history.git", { files: { "a.txt": "1\n" } });
    for (let i = 2; i <= 5; i++) await server.commitFiles("history.git", { "a.txt": `${i}\n` });
    const deep = csi.CreateVolumeRequest.fromPartial({ name: "deep", volumeCapabilities: [mountCapability()], parameters: { url: server.url("history.git"), ref: "main", depth: "1" } });
    await assert.rejects(call(driver.controller.createVolume.bind(driver.controller), deep, 60_000), (err: unknown) => {
      assert.ok(err instanceof CsiError && err.code === status.INVALID_ARGUMENT, String(err));
      assert.match(err.message, /parameters depth: a StorageClass takes only url, ref, baseRef, onDelete/);
      return true;
    });

    // A PersistentVolume's attributes are not refused one by one: a depth there changes nothing.
    const volume = await published("history.git", "history", { depth: "1" });
    const gitDir = await treeGitDir(volume.volumeId);
    assert.equal(await runGit([`--git-dir=${gitDir}`, "rev-parse", "--is-shallow-repository"]), "false");
    assert.equal(await runGit([`--git-dir=${gitDir}`, "rev-list", "--count", "HEAD"]), await server.git("history.git", "rev-list", "--count", "main"));
    assert.equal(await server.git("history.git", "rev-list", "--count", "main"), "5");
    await unpublishAndUnstage(driver, volume);
  });

  /** Arms the volume, then writes as the application. */
  async function armAndWrite(volumeId: string, script: string): Promise<void> {
    await setVolumeClass(driver, volumeId, FAST);
    await sh(script);
  }

  /** The git directory of a volume's work tree in the node's store, whichever bare repository holds it. */
  async function treeGitDir(volumeId: string): Promise<string> {
    const repos = path.join(driver.stateDir, "repos");
    for (const repo of await fs.readdir(repos)) {
      const dir = path.join(repos, repo, "worktrees", volumeId);
      if (await orAbsent(fs.stat(dir))) return dir;
    }
    throw new Error(`no work tree of ${volumeId} under ${repos}`);
  }
});
