import assert from "node:assert/strict";
import { test } from "node:test";
import { ProvisionError, snapshotTagOf } from "../src";

const SNAPSHOT = {
  "csi.storage.k8s.io/volumesnapshot/namespace": "home",
  "csi.storage.k8s.io/volumesnapshot/name": "before-upgrade",
  "csi.storage.k8s.io/volumesnapshotcontent/name": "snapcontent-1f2e",
};

const refusal = (fragment: string) => (err: unknown) => err instanceof ProvisionError && err.parameter === "tag" && err.message.startsWith("parameters.tag ") && err.message.includes(fragment);

test("a VolumeSnapshotClass's tag takes the snapshotter's metadata and names a tag; unset, there is none", () => {
  assert.equal(snapshotTagOf({ tag: "snapshots/${volumesnapshot.namespace}/${volumesnapshot.name}", ...SNAPSHOT }), "refs/tags/snapshots/home/before-upgrade");
  assert.equal(snapshotTagOf({ tag: "${volumesnapshotcontent.name}", ...SNAPSHOT }), "refs/tags/snapcontent-1f2e");
  assert.equal(snapshotTagOf({ ...SNAPSHOT }), undefined);
});

test("a bad tag is refused naming the parameter and the rule", () => {
  assert.throws(() => snapshotTagOf({ tag: "s/${volumesnapshot.uid}", ...SNAPSHOT }), refusal("a tag takes ${volumesnapshot.namespace}, ${volumesnapshot.name}, ${volumesnapshotcontent.name}"));
  assert.throws(() => snapshotTagOf({ tag: "s/${volumesnapshot.name", ...SNAPSHOT }), refusal("never closes it"));
  assert.throws(() => snapshotTagOf({ tag: "s/${volumesnapshot.name}" }), refusal("external-snapshotter sends only with --extra-create-metadata"));
  assert.throws(() => snapshotTagOf({ tag: "${volumesnapshot.name}.lock", ...SNAPSHOT }), refusal('renders "before-upgrade.lock", which is no tag name'));
  assert.throws(() => snapshotTagOf({ tag: "a b", ...SNAPSHOT }), refusal('"a b" is no tag name'));
  assert.throws(() => snapshotTagOf({ tag: "", ...SNAPSHOT }), refusal('"" is no tag name'));
});
