import assert from "node:assert/strict";
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { recoverFromKill } from "../src/trees/recover";
import { Store } from "../src/trees/store";

/** A real git command that waits on its input until it is killed, as one a killed worker left does. */
function blockedGit(gitDir: string): ChildProcess {
  return spawn("git", ["cat-file", "--batch"], { env: { PATH: process.env.PATH, GIT_DIR: gitDir }, stdio: ["pipe", "ignore", "ignore"] });
}

const running = (child: ChildProcess) => child.exitCode === null && child.signalCode === null;

test("a worker that starts after a killed one ends the git it left and removes its locks; nothing of another state directory", async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-recover-"));
  const store = new Store(path.join(dir, "state"));
  const repo = store.repoDir("git://example.invalid/r.git");
  execFileSync("git", ["init", "--quiet", "--bare", repo]);
  const worktree = path.join(repo, "worktrees", "vol");
  await fs.mkdir(worktree, { recursive: true });
  await fs.mkdir(store.volumeDir("vol"), { recursive: true });
  const locks = [path.join(worktree, "index.lock"), path.join(repo, "refs", "heads", "main.lock"), path.join(store.volumeDir("vol"), "metadata.index.lock")];
  for (const lock of locks) await fs.writeFile(lock, "");
  const elsewhere = path.join(dir, "elsewhere.git");
  execFileSync("git", ["init", "--quiet", "--bare", elsewhere]);
  const left = blockedGit(repo);
  const other = blockedGit(elsewhere);
  try {
    await sleep(200);
    const recovered = await recoverFromKill(store);
    assert.equal(recovered.ended, 1);
    assert.deepEqual(recovered.locks.sort(), locks.map((l) => path.relative(store.stateDir, l)).sort());
    for (const lock of locks) await assert.rejects(fs.stat(lock), { code: "ENOENT" });
    await sleep(100);
    assert.equal(running(left), false, "the left git is ended");
    assert.equal(running(other), true, "another state directory's git runs on");
    // The repository takes commands again.
    execFileSync(
      "git",
      [
        "update-ref",
        "refs/heads/main",
        execFileSync("git", ["commit-tree", "-m", "x", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"], {
          env: { ...process.env, GIT_DIR: repo, GIT_AUTHOR_NAME: "a", GIT_AUTHOR_EMAIL: "a@x", GIT_COMMITTER_NAME: "a", GIT_COMMITTER_EMAIL: "a@x" },
        })
          .toString()
          .trim(),
      ],
      { env: { ...process.env, GIT_DIR: repo } },
    );
  } finally {
    left.kill("SIGKILL");
    other.kill("SIGKILL");
    await fs.rm(dir, { recursive: true, force: true });
  }
});
