import assert from "node:assert/strict";
import { test } from "node:test";
import { afterPush, commitsToPush, NO_CREDENTIAL, POD_STOPPED, REBASE_ATTEMPTS, somethingToPush, withoutCredential } from "../src/sync/push-decisions";

const rejected = { outcome: "rejected", message: "stale info" } as const;
const failed = { outcome: "failed", message: "could not resolve host" } as const;
const pushed = { outcome: "pushed" } as const;

test("without its credential a volume owes a failure at pod stop, and waits on a timer", () => {
  assert.deepEqual(withoutCredential(POD_STOPPED, 2), { fail: NO_CREDENTIAL });
  assert.deepEqual(withoutCredential(POD_STOPPED, 0), { wait: { pushed: true, message: NO_CREDENTIAL } }, "nothing owed: the pod may stop");
  assert.deepEqual(withoutCredential("quiesce", 2), { wait: { pushed: false, message: NO_CREDENTIAL } });
});

test("a push runs for commits, for a ref deleted upstream, or for metadata alone", () => {
  assert.equal(somethingToPush(0, false, 0), false);
  assert.equal(somethingToPush(1, false, 0), true);
  assert.equal(somethingToPush(0, true, 0), true, "the deleted ref is pushed back with no new commit");
  assert.equal(somethingToPush(0, false, 3), true, "modes changed: the metadata ref is pushed");
  assert.equal(commitsToPush(0, false), false, "metadata alone pushes no commit");
  assert.equal(commitsToPush(0, true), true);
});

test("a push that landed is done; one that failed is a failure with git's words", () => {
  assert.deepEqual(afterPush(pushed, 0, undefined), { step: "landed" });
  assert.deepEqual(afterPush(failed, 0, undefined), { step: "fail", message: failed.message });
  assert.deepEqual(afterPush(failed, 1, "main-git-csi-v"), { step: "fail", message: failed.message });
});

test("a rejected push rebases, and after REBASE_ATTEMPTS rebases moves to the side branch", () => {
  for (let attempt = 0; attempt < REBASE_ATTEMPTS; attempt++) assert.deepEqual(afterPush(rejected, attempt, undefined), { step: "rebase" }, `attempt ${attempt}`);
  assert.deepEqual(afterPush(rejected, REBASE_ATTEMPTS, undefined), { step: "side-branch", why: `the push was still rejected after ${REBASE_ATTEMPTS} rebases` });
});

test("a rejected push to the side branch is a failure: someone else pushed there, and the volume cannot choose", () => {
  assert.deepEqual(afterPush(rejected, 0, "main-git-csi-v"), { step: "fail", message: "the side branch main-git-csi-v moved on the remote: stale info" });
});
