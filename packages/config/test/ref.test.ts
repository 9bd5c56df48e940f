import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import fc from "fast-check";
import { branchOf, isBranchName } from "../src";
import { gitOutsideRepository, propertyRuns } from "./git";

/** git itself: whether check-ref-format --branch accepts a name, outside any repository so no @{-1} is expanded. */
function branchOracle(t: TestContext): (name: string) => boolean {
  const git = gitOutsideRepository(t);
  return (name) => {
    const result = git("check-ref-format", "--branch", name);
    if (result.status === 0) assert.equal(result.stdout, `${name}\n`, `git expanded ${JSON.stringify(name)}`);
    return result.status === 0;
  };
}

// The characters git's rules are about, among pieces that are fine, so that generated names hit every rule and pass often.
const UNIT = fc.oneof(
  { weight: 5, arbitrary: fc.constantFrom("a", "b", "é", "日", "HEAD", "lock", "/") },
  { weight: 1, arbitrary: fc.constantFrom(..."./-@{}~^:?*[\\ \t\x01\x1f\x7f", ".lock", "refs/heads/") },
);

test("isBranchName agrees with git check-ref-format --branch on generated names", (t) => {
  const gitAccepts = branchOracle(t);
  const runs = propertyRuns(t, 1500);
  let accepted = 0;
  fc.assert(
    fc.property(fc.string({ unit: UNIT, maxLength: 12 }), (name) => {
      const git = gitAccepts(name);
      if (git) accepted++;
      assert.equal(isBranchName(name), git, `git check-ref-format --branch ${JSON.stringify(name)} ${git ? "accepts" : "refuses"} it`);
    }),
    runs,
  );
  // Both answers were tried, not only one of them.
  t.diagnostic(`git accepted ${accepted} of ${runs.numRuns}`);
  assert.ok(accepted > runs.numRuns / 20 && accepted < runs.numRuns - runs.numRuns / 20, `git accepted ${accepted} of ${runs.numRuns}`);
});

test("isBranchName agrees with git on each of its rules", (t) => {
  const gitAccepts = branchOracle(t);
  const names = [
    "main",
    "feature/x",
    "@",
    "HEADx",
    "é",
    "--help",
    "-x",
    "HEAD",
    "a..b",
    "a/.b",
    ".a",
    "x.lock",
    "a/x.lock/b",
    "@{-1}",
    "a@{b",
    "a b",
    "a\tb",
    "a~1",
    "a^",
    "a:b",
    "a?",
    "a*",
    "a[b",
    "a\\b",
    "a.",
    "/a",
    "a/",
    "a//b",
    "",
    "a\x7f",
  ];
  for (const name of names) assert.equal(isBranchName(name), gitAccepts(name), JSON.stringify(name));
  assert.equal(isBranchName("a\0b"), false, "git never sees a NUL: it ends the argument");
});

test("a volume's ref is a branch by its name or under refs/heads/, never another ref", () => {
  assert.equal(branchOf("main"), "main");
  assert.equal(branchOf("refs/heads/main"), "main");
  assert.equal(branchOf("refs/heads/team/app"), "team/app");
  for (const ref of ["refs/tags/v1", "refs/git-csi/metadata", "refs/heads/--help", "--help", "refs/heads/HEAD", "HEAD", "refs/heads/", "a..b"]) assert.equal(branchOf(ref), undefined, ref);
});
