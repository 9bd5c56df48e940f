import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { ClassWatch, loadKubeConfig, type ClassWatchOptions } from "../src";

// A port that refuses: bound, then closed.
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

test("an unreachable API server: each watch retries with a doubling delay, start() waits, stop() ends it all", async () => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-k8s-"));
  const kubeconfig = path.join(dir, "kubeconfig");
  await fs.writeFile(
    kubeconfig,
    JSON.stringify({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: "c", cluster: { server: `http://127.0.0.1:${await closedPort()}` } }],
      users: [{ name: "u", user: {} }],
      contexts: [{ name: "ctx", context: { cluster: "c", user: "u" } }],
      "current-context": "ctx",
    }),
  );
  const retries: Array<{ message: string; retryInMs: number }> = [];
  const logger = { warn: (message: string, meta: { retryInMs: number }) => retries.push({ message, retryInMs: meta.retryInMs }) } as unknown as ClassWatchOptions["logger"];
  const watch = new ClassWatch({ kubeConfig: await loadKubeConfig({ kubeconfig }), logger, onVolume: () => assert.fail("no volume without an API server"), backoff: { initialMs: 50, maxMs: 200 } });
  let started = false;
  const starting = watch.start().then(() => (started = true));

  const claims = () => retries.filter((r) => r.message === "watching PersistentVolumeClaims failed; retrying").map((r) => r.retryInMs);
  while (claims().length < 5) await sleep(50);
  assert.deepEqual(claims().slice(0, 5), [50, 100, 200, 200, 200]);
  assert.equal(started, false);

  await watch.stop();
  await starting;
  const after = retries.length;
  await sleep(400);
  assert.equal(retries.length, after, "nothing retries after stop()");
  await fs.rm(dir, { recursive: true, force: true });
});
