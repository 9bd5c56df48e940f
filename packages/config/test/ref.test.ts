import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import fc from "fast-check";
import { branchOf, isBranchName } from "../src";

/** git itself, run outside any repository so that no @{-1} or @ is expanded against one. */
function gitAccepts(name: string, cwd: string): boolean {
  const result = spawnSync("git", ["check-ref-format", "--branch", name], {
    cwd,
    env: { PATH: process.env.PATH, HOME: cwd, GIT_CEILING_DIRECTORIES: path.dirname(cwd), GIT_CONFIG_NOSYSTEM: "1" },
    encoding: "utf8",
  });
  if (result.status === 0) assert.equal(result.stdout, `${name}\n`, `git expanded ${JSON.stringify(name)}`);
  return result.status === 0;
}

// The characters git's rules are about, among pieces that are fine, so that generated names hit every rule and pass often.
const UNIT = fc.oneof(
  { weight: 5, arbitrary: fc.constantFrom("a", "b", "é", "日", "HEAD", "lock", "/") },
  { weight: 1, arbitrary: fc.constantFrom(..."./-@{}~^:?*[\\ \t\x01\x1f\x7f", ".lock", "refs/heads/") },
);

test("isBranchName agrees with git check-ref-format --branch on generated names", (t) => {
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), "ref-test-"));
  t.after(() => fs.rmSync(cwd, { recursive: true, force: true }));
  const seed = Number(process.env.FC_SEED ?? Date.now() % 2 ** 31);
  const numRuns = 1500;
  t.diagnostic(`seed ${seed} numRuns ${numRuns}`);
  let accepted = 0;
  fc.assert(
    fc.property(fc.string({ unit: UNIT, maxLength: 12 }), (name) => {
      const git = gitAccepts(name, cwd);
      if (git) accepted++;
      assert.equal(isBranchName(name), git, `git check-ref-format --branch ${JSON.stringify(name)} ${git ? "accepts" : "refuses"} it`);
    }),
    { seed, numRuns },
  );
  // Both answers were tried, not only one of them.
  t.diagnostic(`git accepted ${accepted} of ${numRuns}`);
  assert.ok(accepted > numRuns / 20 && accepted < numRuns - numRuns / 20, `git accepted ${accepted} of ${numRuns}`);
});

test("isBranchName agrees with git on each of its rules", (t) => {
  const cwd = fs.mkdtempSync(path.join(os.tmpdir(), "ref-test-"));
  t.after(() => fs.rmSync(cwd, { recursive: true, force: true }));
  const names = ["main", "feature/x", "@", "HEADx", "é", "--help", "-x", "HEAD", "a..b", "a/.b", ".a", "x.lock", "a/x.lock/b", "@{-1}", "a@{b", "a b", "a\tb", "a~1", "a^", "a:b", "a?", "a*", "a[b", "a\\b", "a.", "/a", "a/", "a//b", "", "a\x7f"];
  for (const name of names) assert.equal(isBranchName(name), gitAccepts(name, cwd), JSON.stringify(name));
  assert.equal(isBranchName("a\0b"), false, "git never sees a NUL: it ends the argument");
});

test("a volume's ref is a branch by its name or under refs/heads/, never another ref", () => {
  assert.equal(branchOf("main"), "main");
  assert.equal(branchOf("refs/heads/main"), "main");
  assert.equal(branchOf("refs/heads/team/app"), "team/app");
  for (const ref of ["refs/tags/v1", "refs/git-csi/metadata", "refs/heads/--help", "--help", "refs/heads/HEAD", "HEAD", "refs/heads/", "a..b"]) assert.equal(branchOf(ref), undefined, ref);
});
