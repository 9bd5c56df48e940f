import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import fc from "fast-check";
import { BRANCH_RULE, branchOf, isBranchName, READER_REF_RULE, readerRefOf, refProblem } from "../src";
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

test("a reader's ref is a branch, a tag under refs/tags/ or a full commit id; a bare name is always a branch", () => {
  const commit = "0123456789abcdef0123456789abcdef01234567";
  assert.deepEqual(readerRefOf("main"), { kind: "branch", branch: "main" });
  assert.deepEqual(readerRefOf("refs/heads/v1"), { kind: "branch", branch: "v1" });
  assert.deepEqual(readerRefOf("v1"), { kind: "branch", branch: "v1" });
  assert.deepEqual(readerRefOf("refs/tags/release/v1.2"), { kind: "tag", tag: "release/v1.2" });
  assert.deepEqual(readerRefOf(commit), { kind: "commit", commit });
  assert.deepEqual(readerRefOf(commit.toUpperCase()), { kind: "commit", commit });
  // An abbreviated id is a branch name: only a full id pins.
  assert.deepEqual(readerRefOf(commit.slice(0, 12)), { kind: "branch", branch: commit.slice(0, 12) });
  for (const ref of ["refs/tags/", "refs/tags/a..b", "refs/tags/x.lock", "refs/tags/a b", "refs/notes/x", "HEAD", "--help"]) assert.equal(readerRefOf(ref), undefined, ref);
});

test("tag names agree with git check-ref-format", (t) => {
  const git = gitOutsideRepository(t);
  for (const tag of ["v1", "release/v1.2", "-x", "a..b", ".a", "x.lock", "a b", "a~1", "a:b", "@{-1}", "a/", "a//b", "é"]) {
    const ref = `refs/tags/${tag}`;
    assert.equal(readerRefOf(ref)?.kind === "tag", git("check-ref-format", ref).status === 0, ref);
  }
});

test("a writer's ref must be a branch: a tag or a commit is refused naming the rule; a reader takes all three", () => {
  const commit = "0123456789abcdef0123456789abcdef01234567";
  assert.equal(refProblem("main", false), undefined);
  assert.equal(refProblem("refs/heads/main", true), undefined);
  assert.match(refProblem("refs/tags/v1", false)!, /^names a tag; a writer volume .* must be a branch; a tag or a commit pin is taken only by a read-only volume \(ReadOnlyMany\)$/);
  assert.match(refProblem(commit, false)!, /^names a commit; a writer volume/);
  assert.equal(refProblem("a..b", false), BRANCH_RULE);
  assert.equal(refProblem("refs/tags/v1", true), undefined);
  assert.equal(refProblem(commit, true), undefined);
  assert.equal(refProblem("refs/notes/x", true), READER_REF_RULE);
});
