import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { simpleGit } from "simple-git";
import { GitCommandError } from "../src/remote/git";
import { countCommits, holdsChanges, isAncestor, revParse } from "../src/remote/tree";
import { AUTHOR, tempDir } from "./remote";

/** git in a repository, the way the store runs it: through the environment. */
function gitIn(gitDir: string) {
  return simpleGit({ baseDir: path.dirname(gitDir) }).env({ PATH: process.env.PATH ?? "/usr/bin:/bin", GIT_DIR: gitDir, ...AUTHOR });
}

test("an absent ref is an answer; a git that fails is an error with its argv and stderr, never an empty ref, a zero or false", async (t) => {
  const dir = await tempDir(t, "tree");
  const repo = path.join(dir, "repo.git");
  execFileSync("git", ["init", "--quiet", "--bare", repo]);
  const git = gitIn(repo);
  const commit = (await git.raw(["commit-tree", "4b825dc642cb6eb9a060e54bf8d69288fbee4904", "-m", "first"])).trim();
  await git.raw(["update-ref", "refs/heads/main", commit]);
  assert.equal(await revParse(git, "refs/heads/main"), commit);
  assert.equal(await revParse(git, "refs/heads/absent"), "", "absent is an answer");
  assert.equal(await countCommits(git, "", commit), 1);
  assert.equal(await isAncestor(git, commit, commit), true);

  // The same calls on a repository git cannot read: failures, each naming its command.
  await fs.writeFile(path.join(repo, "HEAD"), "not a ref\n");
  await assert.rejects(revParse(git, "refs/heads/main"), (err: GitCommandError) => err instanceof GitCommandError && err.argv[0] === "rev-parse" && /not a git repository/.test(err.message));
  await assert.rejects(countCommits(git, "", commit), (err: GitCommandError) => err instanceof GitCommandError && err.message.startsWith("git rev-list --count"));
  await assert.rejects(isAncestor(git, commit, "0".repeat(40)), (err: GitCommandError) => err instanceof GitCommandError && err.argv[0] === "merge-base");
});

/** A commit of exactly these files on these parents, made with git's plumbing in a bare repository. */
function committer(repo: string): (files: Record<string, string>, ...parents: string[]) => string {
  const run = (args: string[], input?: string) => execFileSync("git", args, { env: { PATH: process.env.PATH, GIT_DIR: repo, ...AUTHOR }, input, encoding: "utf8" }).trim();
  return (files, ...parents) => {
    const entries = Object.entries(files).map(([name, text]) => `100644 blob ${run(["hash-object", "-w", "--stdin"], text)}\t${name}\n`);
    return run(["commit-tree", run(["mktree"], entries.join("")), ...parents.flatMap((p) => ["-p", p]), "-m", "commit"]);
  };
}

test("holdsChanges: the ref holds a side branch's changes after a merge, a squash or a rebase, and not before, nor after part of it", async (t) => {
  const repo = path.join(await tempDir(t, "holds"), "repo.git");
  execFileSync("git", ["init", "--quiet", "--bare", repo]);
  const git = gitIn(repo);
  const commit = committer(repo);
  const base = commit({ "config.yaml": "name: home\n" });
  const upstream = commit({ "config.yaml": "name: upstream\n" }, base);
  // The side branch changes one line twice: replayed commit by commit onto a squash of itself, its first commit conflicts.
  const first = commit({ "config.yaml": "name: pod\n" }, base);
  const side = commit({ "config.yaml": "name: pod, again\n", "more.txt": "more\n" }, first);
  const merged = { "config.yaml": "name: pod, again\n", "more.txt": "more\n" };

  assert.equal(await holdsChanges(git, upstream, side), false, "not merged");
  assert.equal(await holdsChanges(git, commit(merged, upstream, side), side), true, "a merge commit");
  const squash = commit(merged, upstream);
  assert.equal(await holdsChanges(git, squash, side), true, "a squash");
  assert.equal(await holdsChanges(git, commit(merged, commit({ "config.yaml": "name: pod\n" }, upstream)), side), true, "a rebase");
  assert.equal(await holdsChanges(git, commit({ "config.yaml": "name: pod, again\n" }, upstream), side), false, "a squash that left more.txt out");
  assert.equal(await holdsChanges(git, commit({ ...merged, "other.txt": "a person's\n" }, squash), side), true, "a squash, then a person's commit elsewhere");
  assert.equal(await holdsChanges(git, commit(merged), side), true, "the ref made again with the same files, unrelated");
  await assert.rejects(holdsChanges(git, upstream, "0".repeat(40)), (err: GitCommandError) => err instanceof GitCommandError, "a failure is an error, never false");
});
