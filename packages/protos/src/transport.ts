import * as fs from "node:fs/promises";
import * as path from "node:path";
import {
  type CallOptions,
  type ClientUnaryCall,
  credentials,
  type handleUnaryCall,
  Metadata,
  Server,
  ServerCredentials,
  type ServerUnaryCall,
  type ServiceDefinition,
  type ServiceError,
  type UntypedServiceImplementation,
  status,
} from "@grpc/grpc-js";
import type { Logger } from "@git-csi/logging";
import { asCsiError } from "./errors";

/** `unix:///a/b.sock` or `unix:/a/b.sock` or a bare path → the socket's path. */
export function socketPath(endpoint: string): string {
  const p = endpoint.replace(/^unix:(\/\/)?/, "");
  if (!path.isAbsolute(p)) throw new Error(`endpoint ${endpoint} must be an absolute unix socket path (unix:///path/to.sock)`);
  return p;
}

/** Wraps an async handler: a thrown CsiError becomes its status, anything else INTERNAL, and each failure is logged. */
export function unary<Req, Res>(operation: string, logger: Logger, handler: (request: Req, call: ServerUnaryCall<Req, Res>) => Promise<Res>): handleUnaryCall<Req, Res> {
  return (call, callback) => {
    handler(call.request, call).then(
      (response) => callback(null, response),
      (err: unknown) => {
        const e = asCsiError(err);
        const volume = volumeOf(call.request);
        logger.log(e.code === status.INTERNAL ? "error" : "warn", e.message, { operation, code: status[e.code], ...(volume ? { volume } : {}) });
        callback({ code: e.code, details: e.message, metadata: new Metadata() });
      },
    );
  };
}

function volumeOf(request: unknown): string | undefined {
  const r = request as { volumeId?: unknown; name?: unknown } | null;
  const id = r?.volumeId ?? r?.name;
  return typeof id === "string" && id !== "" ? id : undefined;
}

/**
 * Channelz keeps per-call statistics nobody reads here: at hundreds of
 * volumes it was a tenth of an idle node's gRPC cost. A peer on a local
 * socket that restarted is dialled again within a second: gRPC's default
 * backoff grows to two minutes, and a mount owner that waited that long for
 * a replaced git worker let the leases run out.
 */
const LOCAL_OPTIONS = { "grpc.enable_channelz": 0, "grpc.initial_reconnect_backoff_ms": 200, "grpc.max_reconnect_backoff_ms": 1000 };

export interface Service {
  definition: ServiceDefinition;
  implementation: UntypedServiceImplementation;
}

/** Serves the services on a unix socket, replacing a stale socket file a dead process left. */
export async function serveUnix(endpoint: string, services: Service[]): Promise<Server> {
  const file = socketPath(endpoint);
  await fs.mkdir(path.dirname(file), { recursive: true });
  await fs.rm(file, { force: true });
  const server = new Server(LOCAL_OPTIONS);
  for (const s of services) server.addService(s.definition, s.implementation);
  await new Promise<void>((resolve, reject) => server.bindAsync(`unix://${file}`, ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve())));
  return server;
}

export function stopServer(server: Server, graceMs = 5000): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      server.forceShutdown();
      resolve();
    }, graceMs);
    server.tryShutdown(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

type ClientConstructor<C> = new (address: string, creds: ReturnType<typeof credentials.createInsecure>, options?: object) => C;

export function dialUnix<C>(Client: ClientConstructor<C>, endpoint: string): C {
  return new Client(`unix://${socketPath(endpoint)}`, credentials.createInsecure(), LOCAL_OPTIONS);
}

/** A unary method of a generated client, bound to it. */
export type UnaryMethod<Req, Res> = (request: Req, metadata: Metadata, options: Partial<CallOptions>, callback: (error: ServiceError | null, response: Res) => void) => ClientUnaryCall;

/** Calls a unary method with a deadline; a failure rejects with the callee's status. */
export function call<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, timeoutMs: number): Promise<Res> {
  return new Promise((resolve, reject) => {
    method(request, new Metadata(), { deadline: Date.now() + timeoutMs }, (err, response) => (err ? reject(asCsiError(err)) : resolve(response)));
  });
}
