// The kubelet's liveness check of the frontend without the livenessprobe
// sidecar: GET /healthz answers 200 when CSI Probe would answer ready, and
// 503 with the reason otherwise.
import * as http from "node:http";
import type { Logger } from "@git-csi/logging";
import type { mountOwner } from "@git-csi/protos";
import { probeOwner } from "./identity";

export function serveHealth(address: string, owner: mountOwner.MountOwnerClient, logger: Logger): Promise<http.Server> {
  const split = address.lastIndexOf(":");
  const [host, port] = [address.slice(0, split), Number(address.slice(split + 1))];
  const server = http.createServer((req, res) => {
    if (new URL(req.url ?? "/", "http://localhost").pathname !== "/healthz") return void res.writeHead(404).end("not found\n");
    probeOwner(owner, logger).then(
      (answer) => res.writeHead(answer.ready ? 200 : 503, { "content-type": "text/plain" }).end(answer.ready ? "ok\n" : `${answer.message}\n`),
      (err: unknown) => res.writeHead(503, { "content-type": "text/plain" }).end(`${String(err)}\n`),
    );
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve(server));
  });
}
