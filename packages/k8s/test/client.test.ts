import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { loadKubeConfig } from "../src";

// Each test file runs in its own process: the environment is this file's to change.
async function isolated(): Promise<string> {
  const home = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-k8s-"));
  process.env.HOME = home;
  for (const name of ["KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"]) delete process.env[name];
  return home;
}

function kubeconfig(currentContext: string): string {
  return JSON.stringify({
    apiVersion: "v1",
    kind: "Config",
    clusters: [{ name: "c", cluster: { server: "https://127.0.0.1:6443" } }],
    users: [{ name: "u", user: { token: "not-a-real-token" } }],
    contexts: [{ name: "ctx", context: { cluster: "c", user: "u" } }],
    "current-context": currentContext,
  });
}

test("with nothing configured, the error names every source it looked for", async () => {
  const home = await isolated();
  await assert.rejects(loadKubeConfig(), (err: Error) => {
    assert.match(err.message, /--kubeconfig was not given/);
    assert.match(err.message, /KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not both set/);
    assert.match(err.message, new RegExp(`KUBECONFIG is unset and ${path.join(home, ".kube", "config")} does not exist`));
    return true;
  });
});

test("--kubeconfig wins, and a missing or context-less file is named", async () => {
  const home = await isolated();
  const good = path.join(home, "good");
  await fs.writeFile(good, kubeconfig("ctx"));
  process.env.KUBERNETES_SERVICE_HOST = "10.0.0.1";
  process.env.KUBERNETES_SERVICE_PORT = "443";
  assert.equal((await loadKubeConfig({ kubeconfig: good })).getCurrentCluster()?.server, "https://127.0.0.1:6443");

  await assert.rejects(loadKubeConfig({ kubeconfig: path.join(home, "absent") }), /--kubeconfig \S+absent cannot be read: ENOENT/);
  const stray = path.join(home, "stray");
  await fs.writeFile(stray, kubeconfig("elsewhere"));
  await assert.rejects(loadKubeConfig({ kubeconfig: stray }), /--kubeconfig \S+stray names no cluster for its current context "elsewhere"/);
});

test("KUBECONFIG and ~/.kube/config are the fallback outside a cluster", async () => {
  const home = await isolated();
  await fs.mkdir(path.join(home, ".kube"));
  await fs.writeFile(path.join(home, ".kube", "config"), kubeconfig("ctx"));
  assert.equal((await loadKubeConfig()).getCurrentCluster()?.server, "https://127.0.0.1:6443");
  process.env.KUBECONFIG = path.join(home, "absent");
  await assert.rejects(loadKubeConfig(), /KUBECONFIG=\S+absent: ENOENT/);
});

test("in a pod without its service account token, the error says which file is missing", async (t) => {
  if (
    await fs.stat("/var/run/secrets/kubernetes.io/serviceaccount/token").then(
      () => true,
      () => false,
    )
  )
    return t.skip("this machine has a service account token");
  await isolated();
  process.env.KUBERNETES_SERVICE_HOST = "10.0.0.1";
  process.env.KUBERNETES_SERVICE_PORT = "443";
  await assert.rejects(loadKubeConfig(), /in a cluster \(KUBERNETES_SERVICE_HOST is set\), the service account token \/var\/run\/secrets\/kubernetes.io\/serviceaccount\/token cannot be read: ENOENT/);
});
