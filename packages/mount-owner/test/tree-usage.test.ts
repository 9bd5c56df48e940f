import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test, type TestContext } from "node:test";
import { promisify } from "node:util";
import { TreeUsage, walkTree } from "../src/tree-usage";

const run = promisify(execFile);

async function tree(t: TestContext): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-usage-"));
  t.after(() => fs.rm(dir, { recursive: true, force: true }));
  await fs.mkdir(path.join(dir, "automations", "lights"), { recursive: true });
  await fs.writeFile(path.join(dir, "configuration.yaml"), "homeassistant:\n");
  await fs.writeFile(path.join(dir, "automations", "lights", "hall.yaml"), "x".repeat(100_000));
  await fs.link(path.join(dir, "automations", "lights", "hall.yaml"), path.join(dir, "hall-link.yaml"));
  await fs.symlink("configuration.yaml", path.join(dir, "config-link.yaml"));
  return dir;
}

/** GNU du's answer for the tree: allocated bytes and inodes, each hard link once. */
async function du(dir: string): Promise<{ bytes: number; inodes: number }> {
  const first = async (args: string[]) => Number((await run("du", ["-s", ...args, dir])).stdout.split("\t")[0]);
  return { bytes: await first(["-B1"]), inodes: await first(["--inodes"]) };
}

test("a walk counts what du counts: every entry once, a hard link once, a symlink as itself", async (t) => {
  const dir = await tree(t);
  const use = await walkTree(dir);
  assert.deepEqual(use, await du(dir));
  // The root, two directories, two files, one symlink: the hard link is the file it links.
  assert.equal(use.inodes, 6);
  assert.ok(use.bytes >= 100_000, `${use.bytes} bytes hold the 100,000-byte file`);
});

test("a tree that is not there fails the walk, naming it", async () => {
  await assert.rejects(walkTree("/nonexistent/git-csi-tree"), /ENOENT.*\/nonexistent\/git-csi-tree/);
});

test("an answer is kept a hundred times as long as its walk took, and callers during a walk share it", async (t) => {
  const dir = await tree(t);
  let now = 0;
  const usage = new TreeUsage(() => now);
  const first = usage.of(dir);
  assert.equal(usage.of(dir), first, "a second caller during the walk shares it");
  now = 30; // the walk took 30 ms: kept until 30 + 3,000
  const before = await first;
  await fs.writeFile(path.join(dir, "new.yaml"), "new\n");
  now = 3_029;
  assert.deepEqual(await usage.of(dir), before, "kept while its time runs");
  now = 3_030;
  assert.equal((await usage.of(dir)).inodes, before.inodes + 1, "walked again once it ran out");
});

test("a quick walk is kept a second; a walk that failed is not kept", async (t) => {
  const dir = await tree(t);
  let now = 0;
  const usage = new TreeUsage(() => now);
  const missing = path.join(dir, "later");
  await assert.rejects(usage.of(missing), /ENOENT/);
  await fs.mkdir(missing);
  assert.equal((await usage.of(missing)).inodes, 1, "the failed walk was not kept");
  const before = await usage.of(dir);
  await fs.writeFile(path.join(dir, "new.yaml"), "new\n");
  now = 999;
  assert.equal((await usage.of(dir)).inodes, before.inodes);
  now = 1_000;
  assert.equal((await usage.of(dir)).inodes, before.inodes + 1);
});
