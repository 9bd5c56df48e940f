import assert from "node:assert/strict";
import { test } from "node:test";
import { branchPlanOf, namesClaim, ProvisionError } from "../src";

const CLAIM = { "csi.storage.k8s.io/pvc/namespace": "home", "csi.storage.k8s.io/pvc/name": "ha-config", "csi.storage.k8s.io/pv/name": "pvc-0f3a" };

const refusal = (parameter: string, fragment: string) => (err: unknown) =>
  err instanceof ProvisionError && err.parameter === parameter && err.message.startsWith(`parameters.${parameter} `) && err.message.includes(fragment);

test("a ref's variables take the provisioner's claim metadata, and only such a ref or a baseRef makes a branch", () => {
  assert.deepEqual(branchPlanOf({ ref: "claims/${pvc.metadata.namespace}/${pvc.metadata.name}", ...CLAIM }), { ref: "claims/home/ha-config", baseRef: "", onDelete: "keep", makesBranch: true });
  assert.deepEqual(branchPlanOf({ ref: "${pv.metadata.name}", onDelete: "archive", baseRef: "main", ...CLAIM }), { ref: "pvc-0f3a", baseRef: "main", onDelete: "archive", makesBranch: true });
  assert.deepEqual(branchPlanOf({ ref: "main", ...CLAIM }), { ref: "main", baseRef: "", onDelete: "keep", makesBranch: false });
  assert.deepEqual(branchPlanOf({ ref: "production", baseRef: "refs/heads/main" }), { ref: "production", baseRef: "refs/heads/main", onDelete: "keep", makesBranch: true });
});

test("a bad template, baseRef or onDelete is refused naming the parameter and the rule", () => {
  assert.throws(() => branchPlanOf({ ref: "claims/${pvc.metadata.uid}", ...CLAIM }), refusal("ref", "a ref takes ${pvc.metadata.namespace}, ${pvc.metadata.name}, ${pv.metadata.name}"));
  assert.throws(() => branchPlanOf({ ref: "claims/${pvc.metadata.name", ...CLAIM }), refusal("ref", "never closes it"));
  assert.throws(() => branchPlanOf({ ref: "claims/${pvc.metadata.name}.lock", ...CLAIM }), refusal("ref", 'renders "claims/ha-config.lock", which must name a branch'));
  assert.throws(() => branchPlanOf({ ref: "claims/${pvc.metadata.name}" }), refusal("ref", "--extra-create-metadata"));
  assert.throws(() => branchPlanOf({ ref: "-x" }), refusal("ref", '"-x" must name a branch'));
  assert.throws(() => branchPlanOf({ ref: "${pvc.metadata.name}", baseRef: "a..b", ...CLAIM }), refusal("baseRef", "must name a branch"));
  assert.throws(() => branchPlanOf({ ref: "${pvc.metadata.name}", onDelete: "shred", ...CLAIM }), refusal("onDelete", "must be one of keep, archive, delete"));
  // A branch several claims share is no one claim's to archive or delete.
  for (const ref of ["main", "claims/${pvc.metadata.namespace}"]) {
    assert.throws(() => branchPlanOf({ ref, onDelete: "delete", ...CLAIM }), refusal("onDelete", "applies only to a branch per claim"));
  }
});

test("only a ref with a claim's or a volume's name is a branch per claim, which a restore or a clone may make", () => {
  assert.equal(namesClaim("claims/${pvc.metadata.namespace}/${pvc.metadata.name}"), true);
  assert.equal(namesClaim("${pv.metadata.name}"), true);
  assert.equal(namesClaim("claims/${pvc.metadata.namespace}"), false);
  assert.equal(namesClaim("main"), false);
});

test("a reader's class may pin a tag or a commit, which CreateVolume never makes; a writer's may not", () => {
  const commit = "0123456789abcdef0123456789abcdef01234567";
  assert.deepEqual(branchPlanOf({ ref: "refs/tags/v1", ...CLAIM }, true), { ref: "refs/tags/v1", baseRef: "", onDelete: "keep", makesBranch: false });
  assert.deepEqual(branchPlanOf({ ref: commit }, true), { ref: commit, baseRef: "", onDelete: "keep", makesBranch: false });
  assert.throws(() => branchPlanOf({ ref: "refs/tags/v1" }), refusal("ref", '"refs/tags/v1" names a tag; a writer volume'));
  assert.throws(() => branchPlanOf({ ref: commit }), refusal("ref", "names a commit; a writer volume"));
  assert.throws(() => branchPlanOf({ ref: "refs/tags/${pvc.metadata.name}", ...CLAIM }, true), refusal("ref", '"refs/tags/ha-config" names a tag, which CreateVolume cannot make'));
  assert.throws(() => branchPlanOf({ ref: "refs/tags/v1", baseRef: "main" }, true), refusal("ref", "takes no variable and no baseRef"));
});
