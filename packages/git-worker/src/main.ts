#!/usr/bin/env node
import type * as http from "node:http";
import { booleanFlag, durationFlag, KeyedSerial, parseFlags, runMain } from "@git-csi/config";
import { EventRecorder, FencedPodDeleter, kubeConfigIfAny } from "@git-csi/k8s";
import { createLogger, type Logger, logLifecycle } from "@git-csi/logging";
import { DriverMetrics, serveMetrics } from "@git-csi/metrics";
import { call, dialUnix, gitWorker, mountOwner, serveUnix, stopServer } from "@git-csi/protos";
import * as path from "node:path";
import { endOrphanedAgents, RemoteAccess } from "./remote/access";
import { recoverFromKill } from "./trees/recover";
import { nodeWatch } from "./lease/lease";
import { CredentialBroker } from "./remote/broker";
import type { CollectionPolicy } from "./trees/collect-remote";
import { collectGarbage } from "./trees/gc";
import { type GitWorkerDeps, gitWorkerService, type Syncs } from "./service";
import { type Readers, readerReport } from "./trees/reader";
import { Store } from "./trees/store";
import { checkRelay, logGitTo } from "./remote/git";

/** One collection at a time; a failure is logged and the next one tries again. */
function serialCollector(store: Store, logger: Logger, perRepository: KeyedSerial, policy: CollectionPolicy): () => Promise<void> {
  let running: Promise<void> = Promise.resolve();
  return () => {
    running = running
      .then(() => collectGarbage(store, logger, (repoDir, work) => perRepository.run(repoDir, work), policy))
      .catch((err: Error) => {
        logger.error(`collecting the git store failed: ${err.message}`, { operation: "gc" });
      });
    return running;
  };
}

/** A URL's remote as the collection reaches it: through a volume of it staged here with its credential. */
function reachThrough(syncs: Syncs): CollectionPolicy["reach"] {
  return (url) => {
    const staged = [...syncs.values()].map((s) => s.collectionMember()).filter((m) => m.url === url);
    const remote = staged.find((m) => m.remote)?.remote;
    return remote && { remote, served: new Map(staged.map((m) => [m.volumeId, m.epoch])) };
  };
}

/** A sync sends at most the dirty pages of one mount to disk; an invalidation tells the kernel of each inode it holds. */
const MOUNT_CALL_TIMEOUT_MS = 60_000;

/** SyncMount and InvalidateMount on the mount owner, dialled once: its connection comes back by itself after a restart. */
function mountLink(endpoint: string): Pick<GitWorkerDeps, "syncMount" | "invalidateMount"> {
  const owner = dialUnix(mountOwner.MountOwnerClient, endpoint);
  return {
    syncMount: async (volumeId) => (await call(owner.syncMount.bind(owner), { volumeId }, MOUNT_CALL_TIMEOUT_MS)).mounted,
    invalidateMount: async (volumeId) => (await call(owner.invalidateMount.bind(owner), { volumeId }, MOUNT_CALL_TIMEOUT_MS)).mounted,
  };
}

async function main(): Promise<void> {
  const flags = parseFlags(process.argv.slice(2), "git-worker", "The only git.liken.sh process that runs git: clones, fetches, commits and pushes each volume's work tree.", [
    { name: "state-dir", help: "directory holding the node's bare repositories and work trees", required: true },
    { name: "listen", help: "unix socket this worker serves, unix:///path/git-worker.sock", required: true },
    {
      name: "mount-owner",
      help: "unix socket of the mount owner, asked to sync a volume's mount before its tree moves; empty: unix://<state-dir>/sockets/mount-owner.sock",
      default: "",
    },
    {
      name: "gc-interval",
      help: "how often to collect the driver's refs no volume needs (on the node and on each remote a staged volume reaches), repositories no tree names, and git gc, and to send the commits a kept tree of an unstaged volume holds and its remote lacks to the volume's stranded ref",
      default: "1h",
    },
    {
      name: "owner-ref-retention",
      help: "how long a volume's owner ref stays on the remote once no mount epoch holds it (released, or its lease ran out); a deleted volume's goes at the next collection",
      default: "720h",
    },
    { name: "metrics-address", help: "host:port of the /metrics listener and the per-volume reports at /volumes/<volume>; empty for none", default: "" },
    { name: "node-id", help: "this node's name, the reporting instance of its events", default: process.env.NODE_NAME ?? "" },
    {
      name: "kubeconfig",
      help: "kubeconfig of the API server that receives the volumes' events on their pods and claims; empty: the pod's service account in a cluster, none outside one",
      default: "",
    },
    {
      name: "delete-fenced-pods",
      help: "true: once a volume's mount epoch is lost, delete each pod on that mount that a controller owns, so it starts again on a new stage (needs pods get and delete); false: only tell",
      default: "false",
    },
  ]);
  const logger = createLogger("git-worker");
  logGitTo(logger);
  await checkRelay();
  const store = new Store(flags["state-dir"]!);
  const metrics = new DriverMetrics();
  const syncs: Syncs = new Map();
  const readers: Readers = new Map();
  const orphans = await endOrphanedAgents(store.socketDir());
  if (orphans > 0) logger.warn(`ended ${orphans} ssh-agent(s) a previous git worker left holding keys`, { operation: "startup" });
  const recovered = await recoverFromKill(store);
  if (recovered.ended > 0 || recovered.locks.length > 0) {
    logger.warn(`a previous git worker was killed: ended ${recovered.ended} git process(es) it left and removed ${recovered.locks.length} lock file(s)`, {
      operation: "startup",
      locks: recovered.locks,
    });
  }
  const broker = new CredentialBroker(path.join(store.socketDir(), "credentials.sock"));
  await broker.start();
  const perRepository = new KeyedSerial();
  const kubeConfig = await kubeConfigIfAny(flags.kubeconfig!);
  const events = kubeConfig ? new EventRecorder({ kubeConfig, nodeId: flags["node-id"]!, logger }) : undefined;
  const pods = kubeConfig && booleanFlag(flags, "delete-fenced-pods") ? new FencedPodDeleter(kubeConfig) : undefined;
  const unstaging = new Set<string>();
  // No credential: what a stage without a Secret used, for the kept trees of such volumes.
  const anonymous = await RemoteAccess.open(undefined, store.stateDir, store.socketDir(), broker);
  const collect = serialCollector(store, logger, perRepository, {
    reach: reachThrough(syncs),
    ownerRefRetentionMs: durationFlag(flags, "owner-ref-retention"),
    watch: nodeWatch,
    strand: {
      staged: (volumeId) => syncs.has(volumeId) || unstaging.has(volumeId),
      anonymous: (url) => store.through(url, anonymous),
      events,
    },
  });
  const mount = mountLink(flags["mount-owner"] || `unix://${path.join(store.socketDir(), "mount-owner.sock")}`);
  const gcTimer = setInterval(() => void collect(), durationFlag(flags, "gc-interval"));
  const server = await serveUnix(flags.listen!, [
    { definition: gitWorker.GitWorkerService, implementation: gitWorkerService({ store, syncs, readers, unstaging, broker, metrics, logger, perRepository, collect, events, pods, ...mount }) },
  ]);
  let listener: http.Server | undefined;
  if (flags["metrics-address"]) {
    listener = await serveMetrics(flags["metrics-address"], metrics, [
      async (url) => {
        const m = url.pathname.match(/^\/volumes(?:\/([^/]+))?$/);
        if (!m) return undefined;
        const reports = [...[...syncs.values()].map((s) => s.report()), ...[...readers].map(([id, state]) => readerReport(id, state))].filter((r) => !m[1] || r.volumeId === m[1]);
        if (m[1] && reports.length === 0) return { status: 404, body: `volume ${m[1]} is not staged on this node\n`, contentType: "text/plain" };
        return { status: 200, body: `${JSON.stringify(m[1] ? reports[0] : reports, null, 2)}\n`, contentType: "application/json" };
      },
    ]);
  }
  logLifecycle(logger, async () => {
    clearInterval(gcTimer);
    // Each watcher keeps a snapshot, so writes made while the worker is down are committed after it starts.
    await Promise.all([...syncs.values()].map((s) => s.stop()));
    listener?.close();
    broker.stop();
    await stopServer(server);
  });
  logger.info("started", { operation: "startup", listen: flags.listen, stateDir: flags["state-dir"], metrics: flags["metrics-address"] || undefined });
}

runMain("git-worker", main);
