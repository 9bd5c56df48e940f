import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { test } from "node:test";
import type { Server } from "@grpc/grpc-js";
import { csi } from "../src";
import { call, dialUnix, serveUnix, stopServer } from "../src/transport";

/** An Identity service on the socket that answers every Probe ready. */
function serveIdentity(endpoint: string): Promise<Server> {
  const implementation: Partial<csi.IdentityServer> = { probe: (_call, done) => done(null, { ready: true }) };
  return serveUnix(endpoint, [{ definition: csi.IdentityService, implementation: implementation as csi.IdentityServer }]);
}

test("a local peer that was away for a while is dialled again within seconds of its return, not after gRPC's growing backoff", { timeout: 120_000 }, async (t) => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "transport-"));
  t.after(() => fs.rm(dir, { recursive: true, force: true }));
  const endpoint = `unix://${path.join(dir, "peer.sock")}`;
  let server = await serveIdentity(endpoint);
  const client = dialUnix(csi.IdentityClient, endpoint);
  t.after(() => client.close());
  const probe = () => call(client.probe.bind(client), {}, 1000);
  assert.equal((await probe()).ready, true);
  await stopServer(server);
  // Away for 40 s, asked every 2 s as the mount owner asks a git worker: gRPC's own backoff would have grown past 10 s.
  for (const deadline = Date.now() + 40_000; Date.now() < deadline; await sleep(2000)) await assert.rejects(probe());
  server = await serveIdentity(endpoint);
  t.after(() => stopServer(server));
  const back = Date.now();
  for (;;) {
    const answered = await probe().then(
      () => true,
      () => false,
    );
    if (answered) break;
    assert.ok(Date.now() - back < 5_000, "the peer is back, but 5 s later the client still has not dialled it");
    await sleep(100);
  }
});
