// A cluster test that cannot run fails, naming why: a skipped test has not
// run, and under `make test` nothing may skip.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { clusterMissing } from "../src/cluster";
import { kubeBinDir } from "../src/kube";

const CLUSTER_TEST = path.join(__dirname, "cluster.test.js");

test("a missing cluster tool is named", async () => {
  const empty = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-no-tools-"));
  try {
    const reason = clusterMissing(empty, 0);
    for (const tool of ["etcd", "kube-apiserver", "kubelet", "kubectl"]) assert.ok(reason?.includes(path.join(empty, tool)), `${tool} named in: ${reason}`);
    assert.match(reason!, /run 'make go-tools cluster-tools'/);
  } finally {
    await fs.rm(empty, { recursive: true });
  }
  assert.equal(clusterMissing(kubeBinDir(), 0), undefined, "everything is there for the real cluster test");
});

test("the cluster test run by a user that is not root fails, saying it needs root, and skips nothing", { timeout: 120_000 }, async () => {
  // Without the runner's own marker, which would make the inner run a no-op.
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => name !== "NODE_TEST_CONTEXT"));
  const result = await new Promise<{ code: number | null; out: string }>((resolve) => {
    const child = execFile("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", process.execPath, "--test", CLUSTER_TEST], { cwd: os.tmpdir(), env }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, out: stdout + stderr }),
    );
    child.stdin?.end();
  });
  assert.notEqual(result.code, 0, result.out);
  assert.match(result.out, /the cluster tests need root/);
  assert.match(result.out, /^# skipped 0$/m);
  assert.match(result.out, /^# pass 0$/m);
});
