import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import { METADATA_REF } from "@git-csi/config";
import { createLogger } from "@git-csi/logging";
import { CsiError } from "@git-csi/protos";
import { formatListing, listingPath, type MetadataEntry } from "../src/metadata/format";
import type { GitWorkerDeps } from "../src/service";
import { checkoutReader } from "../src/trees/reader";
import { type ServedRemote, servedRemote, tempDir, workerDeps } from "./remote";

/** refs/git-csi/metadata on the forge with one listing of the branch's root, as a writer's push leaves it. */
function recordRootListing(remote: ServedRemote, base: string, branch: string, entries: MetadataEntry[]): void {
  const env = { PATH: process.env.PATH, HOME: base, GIT_DIR: remote.dir, GIT_INDEX_FILE: path.join(base, "metadata.index") };
  const git = (args: string[], input?: string) => execFileSync("git", args, { env, input, encoding: "utf8" }).trim();
  const blob = git(["hash-object", "-w", "--stdin"], formatListing("", entries));
  git(["update-index", "--add", "--cacheinfo", `100644,${blob},${listingPath(branch, "")}`]);
  remote.git("update-ref", METADATA_REF, remote.git("commit-tree", git(["write-tree"]), "-m", "metadata"));
}

async function modeOf(file: string): Promise<[string, number, number, number]> {
  const st = await fs.lstat(file);
  return [st.isDirectory() ? "dir" : "file", st.mode & 0o7777, st.uid, st.gid];
}

function quietDeps(stateDir: string): GitWorkerDeps {
  const logger = createLogger("git-worker", "info");
  logger.transports[0]!.silent = true;
  return workerDeps(stateDir, logger);
}

test("a reader's checkout of a branch takes the modes, owners and empty directories its metadata records; a tag's and a commit's take none", async (t) => {
  const remote = await servedRemote(t);
  const base = await tempDir(t, "metadata");
  const commit = remote.git("rev-parse", "main");
  remote.git("tag", "v1", "main");
  recordRootListing(remote, base, "main", [
    { name: "README", type: "file", mode: 0o600, uid: 1000, gid: 1000 },
    { name: "empty", type: "dir", mode: 0o750, uid: 1000, gid: 2000 },
  ]);
  const deps = quietDeps(await tempDir(t, "reader-node"));
  const checkout = (volumeId: string, ref: string) => checkoutReader(deps, { volumeId, source: { url: remote.url, ref }, serving: "", pods: [], sharing: [] });

  const branch = await checkout("on-branch", "main");
  assert.deepEqual(await modeOf(path.join(branch.treePath, "README")), ["file", 0o600, 1000, 1000]);
  assert.deepEqual(await modeOf(path.join(branch.treePath, "empty")), ["dir", 0o750, 1000, 2000]);

  for (const [volumeId, ref] of [
    ["on-tag", "refs/tags/v1"],
    ["on-commit", commit],
  ] as const) {
    const pinned = await checkout(volumeId, ref);
    assert.equal(pinned.commit, commit);
    // git's mode and the worker's own user: no listing says otherwise.
    assert.deepEqual(await modeOf(path.join(pinned.treePath, "README")), ["file", 0o644, process.getuid!(), process.getgid!()], ref);
    await assert.rejects(fs.lstat(path.join(pinned.treePath, "empty")), { code: "ENOENT" });
  }
});

test("a tag or a commit the forge lacks is FailedPrecondition naming it; a bare name is a branch", async (t) => {
  const remote = await servedRemote(t);
  remote.git("tag", "v1", "main");
  const deps = quietDeps(await tempDir(t, "reader-node"));
  const checkout = (volumeId: string, ref: string) => checkoutReader(deps, { volumeId, source: { url: remote.url, ref }, serving: "", pods: [], sharing: [] });
  const absent = "2".repeat(40);
  for (const [ref, said] of [
    ["refs/tags/v2", "the tag refs/tags/v2 does not exist"],
    [absent, `the commit ${absent} does not exist`],
    ["v1", "ref v1 does not exist"],
  ]) {
    await assert.rejects(
      checkout("missing", ref!),
      (err: unknown) => err instanceof CsiError && err.code === status.FAILED_PRECONDITION && err.message.includes(said!) && err.message.includes(remote.url),
    );
  }
});
