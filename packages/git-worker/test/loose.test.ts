import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { looseRef, writeLooseObject } from "../src/remote/loose";
import { AUTHOR, gitAt, tempDir } from "./remote";

test("looseRef reads a worktree's HEAD through its branch, as rev-parse does, and leaves a packed ref or a missing one to git", async (t) => {
  const dir = await tempDir(t, "loose-ref");
  const bare = path.join(dir, "repo.git");
  const git = gitAt(bare, dir);
  execFileSync("git", ["init", "--quiet", "--bare", "--initial-branch=main", bare]);
  const first = git("commit-tree", "-m", "first", "4b825dc642cb6eb9a060e54bf8d69288fbee4904");
  git("update-ref", "refs/heads/main", first);
  const work = path.join(dir, "work");
  git("worktree", "add", "--quiet", work, "main");
  const at = { gitDir: path.join(bare, "worktrees", "work"), commonDir: bare };
  const repo = { gitDir: bare, commonDir: bare };

  assert.equal(await looseRef(at, "HEAD"), first);
  const second = git("commit-tree", "-p", first, "-m", "second", "4b825dc642cb6eb9a060e54bf8d69288fbee4904");
  git("update-ref", "refs/heads/main", second);
  assert.equal(await looseRef(at, "HEAD"), second, "the branch's new commit");
  git("update-ref", "refs/git-csi/upstream/metadata", first);
  assert.equal(await looseRef(repo, "refs/git-csi/upstream/metadata"), first);

  git("pack-refs", "--all");
  assert.equal(await looseRef(repo, "refs/git-csi/upstream/metadata"), undefined, "packed: git answers");
  assert.equal(await looseRef(at, "HEAD"), undefined, "HEAD's branch packed: git answers");
  assert.equal(await looseRef(repo, "refs/heads/none"), undefined);
});

test("writeLooseObject writes the object git hash-object writes, under the same oid, and keeps one already there", async (t) => {
  const dir = await tempDir(t, "loose-object");
  const bare = path.join(dir, "repo.git");
  const git = gitAt(bare, dir);
  execFileSync("git", ["init", "--quiet", "--bare", bare]);
  const signature = "git.liken.sh <owner@git.liken.sh> 1700000000 +0000";
  const text = `tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor ${signature}\ncommitter ${signature}\n\nvolume: v\nnode: é\n`;
  const file = path.join(dir, "object");
  await fs.writeFile(file, text);
  const expected = execFileSync("git", ["hash-object", "-t", "commit", "--no-filters", file], { env: { PATH: process.env.PATH, HOME: dir, ...AUTHOR }, encoding: "utf8" }).trim();

  const oid = await writeLooseObject(path.join(bare, "objects"), "commit", text);
  assert.equal(oid, expected);
  assert.equal(git("cat-file", "-t", oid), "commit");
  assert.equal(`${git("cat-file", "commit", oid)}\n`, text);
  assert.equal(await writeLooseObject(path.join(bare, "objects"), "commit", text), oid, "written again: the same object");
  assert.deepEqual(
    (await fs.readdir(path.join(bare, "objects", oid.slice(0, 2)))).filter((f) => f.startsWith("tmp_obj_")),
    [],
    "no temporary file left",
  );
  git("fsck", "--strict", "--no-dangling");
});
