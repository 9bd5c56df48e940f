// Keeping every FUSE connection across a restart of this mount owner. The
// kernel keeps a connection while any process holds its /dev/fuse descriptor:
// each mount's descriptor is handed to the descriptor keeper (gitcsi-fd-keeper,
// a process outside this container), and this process keeps its own copy, so
// whichever of the two restarts, the other still holds the connection. A
// restarted mount owner takes the descriptors back and serves them again,
// once the epoch of each is checked (MountOwner.resume).
import * as path from "node:path";
import * as fs from "node:fs/promises";
import { closeSync, statSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { orAbsent } from "@git-csi/config";
import type { Logger } from "@git-csi/logging";
import type { OperationMetrics } from "@git-csi/metrics";
import { type CsiError } from "@git-csi/protos";
import { status } from "@grpc/grpc-js";
import { type EpochFence, type FuseMount, type KeptConnection, mountFuse, resumeFuse, servingClock, setIncarnation, takeKept } from "./fuse/binding";
import { fuseSource } from "./mounts";
import type { MountOwner, StagedMount, StagedPaths } from "./service";
import { writeFileAtomic } from "./state";

const INCARNATION_FILE = "mount-owner.incarnation";
const LAST_INCARNATION = 65535;
/** How often the keeper's socket is looked at: a keeper that restarted holds nothing and is told every connection again. */
export const KEEP_AGAIN_MS = 2000;
/** How soon a resume whose epoch could not be checked (the git worker is not up yet) is tried again. */
const RESUME_RETRY_MS = 500;

/**
 * Open files' handles name the mount owner that opened them (native/handles.c):
 * each process is one more than the last on the node, 1 to 65535, recorded
 * before it opens a file.
 */
export async function nextIncarnation(stateDir: string): Promise<number> {
  const file = path.join(stateDir, INCARNATION_FILE);
  const text = await orAbsent(fs.readFile(file, "utf8"));
  const last = text === undefined ? 0 : Number(text.trim());
  if (!Number.isInteger(last) || last < 0 || last > LAST_INCARNATION) {
    throw new Error(`${file} holds ${JSON.stringify(text)}, not a mount owner incarnation from 0 to ${LAST_INCARNATION}; remove it to start from 1`);
  }
  const next = (last % LAST_INCARNATION) + 1;
  await writeFileAtomic(file, `${next}\n`, 0o600);
  return next;
}

export interface HandoverDeps {
  /** The keeper's unix socket path. */
  keeperSocket: string;
  stateDir: string;
  logger: Logger;
  metrics: OperationMetrics;
  /** Spec 000's lease: an epoch not checked within one after the restart has certainly run out. */
  leaseMs: number;
}

export class Handover {
  private readonly mounts = new Map<string, FuseMount>();
  private keeperAnswers = true;
  /** The keeper that was last told every connection, by currentKeeper. */
  private toldKeeper: string | undefined;

  private constructor(private readonly deps: HandoverDeps) {}

  /** This process's incarnation is recorded and set before any mount serves. */
  static async start(deps: HandoverDeps): Promise<Handover> {
    setIncarnation(await nextIncarnation(deps.stateDir));
    return new Handover(deps);
  }

  /** A new mount of a staged volume, its connection kept from the start. */
  mount(volumeId: string, treePath: string, stagingPath: string, epoch: EpochFence): StagedMount {
    return this.kept(volumeId, mountFuse({ mountpoint: stagingPath, backing: treePath, fsname: fuseSource(volumeId), epoch }));
  }

  /**
   * Serves every connection the keeper holds again, each once its epoch is
   * checked. Until then a request on it waits in the kernel; none fails.
   */
  resumeAll(owner: MountOwner): void {
    // Looked at before the take: a keeper that restarts in between is another one, told everything at the next interval.
    const keeper = this.currentKeeper();
    const connections = this.take();
    if (connections === undefined) return;
    // The keeper that answered still holds every connection it gave: it is told again only once it restarts, and that is logged.
    this.toldKeeper = keeper;
    for (const connection of connections) void this.resumeOne(owner, connection);
  }

  /**
   * Tells the keeper every connection again once it restarted (or stopped
   * answering). Idle, this is one stat of its socket per interval, not one
   * descriptor sent per mount: with hundreds of mounts that was most of the
   * node's idle CPU.
   */
  keepTelling(): NodeJS.Timeout {
    return setInterval(() => {
      const keeper = this.currentKeeper();
      if (keeper === this.toldKeeper && this.keeperAnswers) return;
      if (keeper !== undefined && this.toldKeeper !== undefined && keeper !== this.toldKeeper) {
        this.deps.logger.info(`the FUSE descriptor keeper restarted; telling it the ${this.mounts.size} connection(s) again`, { operation: "fuse_keep", keeper: this.deps.keeperSocket });
      }
      let told = true;
      for (const [volumeId, mount] of this.mounts) told = this.tell(volumeId, mount) && told;
      this.toldKeeper = told ? keeper : undefined;
    }, KEEP_AGAIN_MS);
  }

  /**
   * The keeper's socket as bound: a keeper that starts unlinks the old socket
   * and binds a new one, so another identity is another keeper. Undefined
   * when no keeper has bound it, or (logged) when it cannot be looked at:
   * then every connection is told again next time.
   */
  private currentKeeper(): string | undefined {
    try {
      const bound = statSync(this.deps.keeperSocket, { bigint: true });
      return `${bound.dev}:${bound.ino}:${bound.birthtimeNs}:${bound.ctimeNs}`;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") {
        this.deps.logger.warn(`the FUSE descriptor keeper's socket cannot be looked at: ${(err as Error).message}`, { operation: "fuse_keep", keeper: this.deps.keeperSocket });
      }
      return undefined;
    }
  }

  /**
   * The last step of a graceful stop: the keeper holds every connection and no
   * request is left half served; the next mount owner serves the rest.
   */
  handOff(): void {
    for (const [volumeId, mount] of this.mounts) {
      if (!this.tell(volumeId, mount)) this.deps.logger.error("the keeper does not hold the volume's FUSE connection: it ends with this process", { volume: volumeId, operation: "fuse_handover" });
      mount.quiesce();
    }
    this.deps.logger.info("every FUSE connection handed over", { operation: "fuse_handover", connections: this.mounts.size });
  }

  private kept(volumeId: string, mount: FuseMount): StagedMount {
    this.mounts.set(volumeId, mount);
    this.tell(volumeId, mount);
    return {
      ...mount,
      unmount: async () => {
        // The keeper lets the connection go by itself once the kernel ended it.
        this.mounts.delete(volumeId);
        await mount.unmount();
      },
    };
  }

  /** True when the keeper now holds the connection; a change of answer is logged once. */
  private tell(volumeId: string, mount: FuseMount): boolean {
    try {
      mount.keep(this.deps.keeperSocket, volumeId);
      if (!this.keeperAnswers) this.deps.logger.info("the FUSE descriptor keeper answers again", { operation: "fuse_keep", keeper: this.deps.keeperSocket });
      this.keeperAnswers = true;
    } catch (err) {
      if (this.keeperAnswers) {
        this.deps.logger.warn(`the FUSE descriptor keeper does not answer; a restart of the mount owner now ends the mounts it would keep: ${(err as Error).message}`, {
          volume: volumeId,
          operation: "fuse_keep",
          keeper: this.deps.keeperSocket,
        });
      }
      this.keeperAnswers = false;
    }
    return this.keeperAnswers;
  }

  /** What the keeper holds; undefined when it does not answer, and every connection is told again at the next interval. */
  private take(): KeptConnection[] | undefined {
    try {
      const taken = takeKept(this.deps.keeperSocket);
      this.deps.logger.info(`the keeper holds ${taken.length} FUSE connection(s)`, { operation: "fuse_resume", keeper: this.deps.keeperSocket });
      return taken;
    } catch (err) {
      this.deps.logger.warn(`no FUSE connection to resume: the descriptor keeper does not answer: ${(err as Error).message}`, { operation: "fuse_resume", keeper: this.deps.keeperSocket });
      this.keeperAnswers = false;
      return undefined;
    }
  }

  /** Until it is served again, the connection's pages wait in the kernel: a SyncMount of the volume cannot answer. */
  private async resumeOne(owner: MountOwner, connection: KeptConnection): Promise<void> {
    const resumed = owner.awaitResume(connection.key);
    try {
      await this.resumeUntilChecked(owner, connection);
    } finally {
      resumed();
    }
  }

  /** Tries until the epoch is checked; after a whole lease unchecked, it has run out: the mount serves only EIO. */
  private async resumeUntilChecked(owner: MountOwner, connection: KeptConnection): Promise<void> {
    const volumeId = connection.key;
    const log = { volume: volumeId, operation: "fuse_resume" };
    const serve = async (paths: StagedPaths, epoch: EpochFence) =>
      this.kept(volumeId, resumeFuse({ mountpoint: paths.stagingPath, backing: paths.treePath, fsname: fuseSource(volumeId), epoch }, connection));
    const deadline = servingClock() + this.deps.leaseMs;
    for (;;) {
      const lost = servingClock() > deadline ? "the epoch could not be checked within a lease of the mount owner's restart" : undefined;
      try {
        const held = await owner.resume(volumeId, serve, lost);
        this.deps.metrics.count(held ? "fuse_resumed" : "fuse_resume_epoch_lost");
        this.deps.logger.log(held ? "info" : "error", held ? "the FUSE connection serves again" : "the FUSE connection was kept, but its epoch no longer holds the volume: it serves only EIO", log);
        return;
      } catch (err) {
        if ((err as CsiError).code === status.FAILED_PRECONDITION) {
          // Not a stage of this node: the keeper lets it go once the kernel's mounts of it are gone.
          closeSync(connection.fd);
          this.deps.logger.warn(`a kept FUSE connection is not resumed: ${(err as Error).message}`, log);
          return;
        }
        this.deps.logger.warn(`the epoch of a kept FUSE connection is not checked yet; its requests wait: ${(err as Error).message}`, log);
        await sleep(RESUME_RETRY_MS);
      }
    }
  }
}
