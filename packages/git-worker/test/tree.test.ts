import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { simpleGit } from "simple-git";
import { GitCommandError } from "../src/git";
import { countCommits, isAncestor, revParse } from "../src/tree";
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
