import { Reason } from "@git-csi/config";
import { deleteRefs, fetchStranded, pushStranded, RemoteError } from "../remote/remote";
import { holdsChanges, revParse, statusOf } from "../remote/tree";
import type { VolumeReporter } from "../report";
import { strandedRef, upstreamRef } from "../trees/store";
import { markStranded } from "../trees/strand-kept";
import type { VolumeUpstream } from "./upstream";
import type { VolumeState } from "./volume";

/**
 * Commits no push could land, kept on the remote rather than on one node's
 * disk: an epoch that lost the volume leaves them at its unstage on a
 * stranded ref, and the volume's next stage, on any node, brings them in as
 * it brings in upstream (a rebase), until its ref holds them.
 */
export class VolumeStranded {
  /** Stranded refs whose commits the tree holds and its ref does not yet, ref → commit: they go once a push lands them. */
  private readonly adopted = new Map<string, string>();

  constructor(
    private readonly s: VolumeState,
    private readonly report: VolumeReporter,
    private readonly upstream: VolumeUpstream,
  ) {}

  /**
   * At unstage, when commits the remote lacks remain: the tree's HEAD to its
   * stranded ref. A remote that is away leaves them in the node's kept tree,
   * and the node's collection sends them once it reaches the remote
   * (trees/strand-kept.ts).
   */
  async leave(): Promise<void> {
    const s = this.s;
    if (s.unpushed === 0) return;
    const head = await revParse(s.tree, "HEAD");
    try {
      await s.remote((repo) => pushStranded(repo, s.volumeId, head));
    } catch (err) {
      if (!(err instanceof RemoteError)) throw err;
      s.log("warn", `${s.unpushed} commit(s) no push landed stay in the node's work tree until its collection reaches the remote: ${err.message}`, "strand");
      return;
    }
    await markStranded(s.volumeDir, head);
    this.report.emit(
      Reason.Stranded,
      "Warning",
      `${s.unpushed} commit(s) no push could land on ${s.pushBranch} (${s.lastPushError || "the volume was unstaged first"}) wait on ${strandedRef(s.volumeId, head)}: the volume's next stage, on any node, brings them in`,
    );
  }

  /** At stage, once the tree follows its ref: each stranded ref's commits replayed onto the tree, or told of where they conflict. */
  async adopt(): Promise<void> {
    const s = this.s;
    const stranded = await s.remote((repo) => fetchStranded(repo, s.volumeId));
    for (const [ref, commit] of stranded) await this.adoptOne(ref, commit);
  }

  private async adoptOne(ref: string, commit: string): Promise<void> {
    const s = this.s;
    const landed = await revParse(s.repo, upstreamRef(s.pushBranch));
    if (landed !== "" && (await holdsChanges(s.repo, landed, commit))) {
      await this.forget([[ref, commit]]);
      return;
    }
    const head = await revParse(s.tree, "HEAD");
    if (await holdsChanges(s.repo, head, commit)) {
      this.adopted.set(ref, commit);
      return;
    }
    if (!(await s.syncMountAtStage())) {
      s.log("warn", `${ref} waits for the volume's next stage: the tree may lack writes its mount holds`, "strand", { ref });
      return;
    }
    if ((await statusOf(s.tree)).length === 0 && (await this.upstream.takeStranded(head, commit))) {
      this.adopted.set(ref, commit);
      this.report.emit(Reason.Rebased, "Normal", `the commits a lost mount epoch left on ${ref} were rebased onto the tree; the volume's next push lands them on ${s.pushBranch}`);
      await this.upstream.refreshUnpushed();
      return;
    }
    this.report.emit(
      Reason.Stranded,
      "Warning",
      `${ref} holds commits a lost mount epoch made that conflict with the tree, or the tree has uncommitted writes: they stay on that ref, nothing is lost; merge them into ${s.pushBranch} by hand (git fetch origin ${ref}) and delete the ref`,
    );
  }

  /** A push landed `pushed` on the volume's branch: the stranded refs it holds go. */
  async settle(pushed: string): Promise<void> {
    const held = [];
    for (const [ref, commit] of this.adopted) if (await holdsChanges(this.s.repo, pushed, commit)) held.push([ref, commit] as [string, string]);
    if (held.length > 0) await this.forget(held);
  }

  /** Deletes stranded refs whose commits the volume's branch holds; one that moved since stays. A remote that is away leaves them for the next stage. */
  private async forget(refs: [string, string][]): Promise<void> {
    const s = this.s;
    for (const [ref] of refs) this.adopted.delete(ref);
    try {
      const { deleted } = await s.remote((repo) =>
        deleteRefs(
          repo,
          refs.map(([ref, expected]) => ({ ref, expected })),
        ),
      );
      for (const ref of deleted) s.log("info", `deleted ${ref}: ${s.pushBranch} holds its commits`, "strand", { ref });
    } catch (err) {
      if (!(err instanceof RemoteError)) throw err;
      s.log("warn", `the stranded refs stay until the next stage: ${err.message}`, "strand");
    }
  }
}
