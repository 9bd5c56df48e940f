import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { commitFiles, type FileNow } from "../src/sync/fast-commit";
import { AUTHOR, tempDir } from "./remote";

const author = { name: "app", email: "app@localhost" };

test("commitFiles commits files onto HEAD as git add and write-tree would, from the work tree alone, without reading the index", async (t) => {
  const dir = await tempDir(t, "fast-commit");
  const work = path.join(dir, "work");
  const gitDir = path.join(dir, "repo.git");
  const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: dir, GIT_DIR: gitDir, GIT_WORK_TREE: work, ...AUTHOR };
  const git = (...args: string[]) => execFileSync("git", args, { cwd: work, env, encoding: "utf8" }).trim();
  await fs.mkdir(work);
  execFileSync("git", ["init", "--quiet", "--bare", gitDir]);
  const files: Record<string, string> = { "keep.txt": "kept\n", "d/edit.txt": "old\n", "d/gone.txt": "gone\n", "crlf.txt": "a\n", ".gitattributes": "crlf.txt text eol=lf\n", "was-dir/x": "x\n" };
  for (const [p, content] of Object.entries(files)) {
    await fs.mkdir(path.dirname(path.join(work, p)), { recursive: true });
    await fs.writeFile(path.join(work, p), content);
  }
  git("add", "-A");
  git("commit", "--quiet", "-m", "first");

  // A modified file, a deleted one, a new executable two directories down, a name only quotes carry, a CRLF file the attributes convert.
  const quotedName = 'd/a "b"\\c\n.txt';
  await fs.writeFile(path.join(work, "d/edit.txt"), "new\n");
  await fs.rm(path.join(work, "d/gone.txt"));
  await fs.mkdir(path.join(work, "n/m"), { recursive: true });
  await fs.writeFile(path.join(work, "n/m/run.sh"), "#!/bin/sh\n", { mode: 0o755 });
  await fs.writeFile(path.join(work, quotedName), "quoted\n");
  await fs.writeFile(path.join(work, "crlf.txt"), "a\r\nb\r\n");
  const changed = ["d/edit.txt", "d/gone.txt", "n/m/run.sh", quotedName, "crlf.txt", "keep.txt"];
  const now = async (p: string): Promise<FileNow> => ({ path: p, stat: await fs.lstat(path.join(work, p)).catch(() => undefined) });
  const nowFiles = await Promise.all(changed.map(now));

  // git's own way, for comparison: then an index git cannot read, which commitFiles never opens.
  git("update-index", "--add", "--remove", "--", ...changed);
  const expectedTree = git("write-tree");
  git("read-tree", "HEAD");
  await fs.writeFile(path.join(gitDir, "index"), "not an index\n");

  const at = { cwd: work, env: { HOME: dir, GIT_DIR: gitDir, GIT_WORK_TREE: work }, config: [] };
  const head = git("rev-parse", "HEAD");
  const branch = git("symbolic-ref", "HEAD");
  let listed: string[] = [];
  const made = await commitFiles(at, head, nowFiles, author, (statuses) => {
    listed = statuses.map((s) => `${s.deleted ? "D" : "M"} ${s.path}`);
    return "five paths\n";
  });
  assert.ok(made !== undefined && made !== "unchanged");
  assert.equal(made.parent, head);
  assert.equal(git("rev-parse", `${made.commit}^{tree}`), expectedTree, "the tree git add and write-tree give");
  assert.equal(git("rev-parse", `${made.commit}^`), head);
  assert.ok(git("cat-file", "commit", made.commit).endsWith("\n\nfive paths"), "the message as given");
  assert.deepEqual(listed, ["M d/edit.txt", "D d/gone.txt", "M n/m/run.sh", `M ${quotedName}`, "M crlf.txt"], "keep.txt did not change");
  assert.equal(git("rev-parse", "HEAD"), made.commit, "HEAD moved to it");
  assert.equal(git("symbolic-ref", "HEAD"), branch, "through the branch HEAD names");

  // Nothing changed: no commit. A path HEAD holds as a directory: the index decides.
  await fs.writeFile(path.join(work, "d/edit.txt"), "new\n");
  assert.equal(await commitFiles(at, made.commit, [await now("d/edit.txt")], author, () => "x\n"), "unchanged");
  await fs.rm(path.join(work, "was-dir"), { recursive: true });
  await fs.writeFile(path.join(work, "was-dir"), "a file now\n");
  assert.equal(await commitFiles(at, made.commit, [await now("was-dir")], author, () => "x\n"), undefined);
  assert.equal(git("rev-parse", "HEAD"), made.commit, "neither moved HEAD");
});
