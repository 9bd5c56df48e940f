import { after, before, test } from "node:test";
import * as assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import { runGit, startGitDaemon, type GitServer } from "../src/git-server";

let srv: GitServer;
let work: string;

before(async () => {
  srv = await startGitDaemon();
  work = await mkdtemp(path.join(os.tmpdir(), "git-csi-gitd-test-"));
});

after(async () => {
  await srv?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

test("clone, push, and server-side commits against a real git daemon", async () => {
  const initial = await srv.createRepo("demo.git", {
    files: { "hello.txt": "hello\n", "dir/nested.txt": "nested\n" },
  });
  assert.match(initial, /^[0-9a-f]{40}$/);
  assert.equal(await srv.git("demo.git", "rev-parse", "refs/heads/main"), initial);
  assert.equal(await srv.git("demo.git", "symbolic-ref", "HEAD"), "refs/heads/main");

  const clone = path.join(work, "clone");
  await runGit(["clone", "--quiet", srv.url("demo.git"), clone]);
  assert.equal(await readFile(path.join(clone, "hello.txt"), "utf8"), "hello\n");
  assert.equal(await readFile(path.join(clone, "dir/nested.txt"), "utf8"), "nested\n");
  assert.equal(existsSync(path.join(clone, "README.md")), false);

  await writeFile(path.join(clone, "hello.txt"), "hello again\n");
  await writeFile(path.join(clone, "new.txt"), "new\n");
  await runGit(["add", "-A"], { cwd: clone });
  await runGit(["commit", "--quiet", "-m", "change"], { cwd: clone });
  const local = await runGit(["rev-parse", "HEAD"], { cwd: clone });
  await runGit(["push", "--quiet", "origin", "HEAD:refs/heads/main"], { cwd: clone });

  const moved = await srv.git("demo.git", "rev-parse", "refs/heads/main");
  assert.equal(moved, local);
  assert.notEqual(moved, initial);
  assert.equal(await srv.git("demo.git", "show", "main:hello.txt"), "hello again");
  assert.deepEqual((await srv.git("demo.git", "ls-tree", "-r", "--name-only", "main")).split("\n"), ["dir/nested.txt", "hello.txt", "new.txt"]);

  // server-side commit (upstream change) is visible to a fetch
  const upstream = await srv.commitFiles("demo.git", { "up.txt": "up\n" }, { remove: ["new.txt"] });
  await runGit(["pull", "--quiet", "--ff-only", "origin", "main"], { cwd: clone });
  assert.equal(await runGit(["rev-parse", "HEAD"], { cwd: clone }), upstream);
  assert.equal(await readFile(path.join(clone, "up.txt"), "utf8"), "up\n");
  assert.equal(existsSync(path.join(clone, "new.txt")), false);
});

test("createRepo defaults and custom branch", async () => {
  await srv.createRepo("plain");
  assert.equal(await srv.git("plain", "show", "main:README.md"), "# plain");
  await srv.createRepo("nested/other.git", { branch: "dev", files: { "x.txt": "x" } });
  const heads = await runGit(["ls-remote", "--heads", srv.url("nested/other.git")]);
  assert.match(heads, /^[0-9a-f]{40}\trefs\/heads\/dev$/);
  await assert.rejects(srv.git("plain", "rev-parse", "--verify", "refs/heads/nope"));
  assert.throws(() => srv.url("../escape"));
});
