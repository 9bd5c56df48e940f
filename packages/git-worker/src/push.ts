import * as path from "node:path";
import { METADATA_REF, Reason } from "@git-csi/config";
import { recordMetadata } from "./metadata-record";
import { afterMetadataPush, afterPush, commitsToPush, somethingToPush, type SyncOutcome, withoutCredential } from "./push-decisions";
import { fetchMetadata, pushCommit, pushMetadata, RemoteError } from "./remote";
import type { VolumeReporter } from "./report";
import type { SyncScheduler } from "./schedule";
import { UPSTREAM_METADATA } from "./store";
import { revParse } from "./tree";
import type { VolumeUpstream } from "./upstream";
import type { VolumeState } from "./volume";

/**
 * Pushing, spec 004 "What happens after a write": the volume's commits to
 * its ref (or side branch) under the lease's fence, a rejected push rebased
 * onto upstream, then refs/git-csi/metadata. push-decisions.ts decides; this
 * carries the decisions out with git.
 */
export class VolumePush {
  constructor(
    private readonly s: VolumeState,
    private readonly report: VolumeReporter,
    private readonly scheduler: SyncScheduler,
    private readonly upstream: VolumeUpstream,
  ) {}

  /** Any failure to reach the remote on the way (a fetch, the metadata, the push itself) is a failed push. */
  async push(trigger: string): Promise<SyncOutcome> {
    try {
      // A whole push, fetch and rebase included, holds the URL's repository: volumes of one URL take turns.
      return await this.s.ctx.onRepository(() => this.pushOnce(trigger));
    } catch (err) {
      if (err instanceof RemoteError) return this.pushFailed(err.message);
      throw err;
    }
  }

  private async pushOnce(trigger: string): Promise<SyncOutcome> {
    const s = this.s;
    this.scheduler.pushStarts();
    if (s.waitingForCredential) {
      const decision = withoutCredential(trigger, s.unpushed);
      return "fail" in decision ? this.pushFailed(decision.fail) : decision.wait;
    }
    if (s.onSideBranch) await this.upstream.tryToHeal();
    if (!somethingToPush(s.unpushed, s.refDeleted, s.metadataChanged.size)) return { pushed: true, message: "nothing to push" };
    const failed = await this.pushCommits();
    if (failed) return failed;
    await this.pushMetadata();
    return { pushed: true, message: `pushed to ${s.pushBranch}` };
  }

  /**
   * Pushes the tree's HEAD, or its rebase onto a ref that moved. The rebased
   * commit goes out straight from the scratch worktree; the pod's tree takes
   * it once it landed. Answers the failure, or nothing once the commits landed.
   */
  private async pushCommits(): Promise<SyncOutcome | undefined> {
    const s = this.s;
    const head = await revParse(s.tree, "HEAD");
    let candidate = head;
    for (let attempt = 0; commitsToPush(s.unpushed, s.refDeleted); attempt++) {
      const result = await s.fenced((repo, fence) => pushCommit(repo, candidate, s.pushBranch, fence), [candidate]);
      const next = afterPush(result, attempt, s.onSideBranch ? s.sideBranch : undefined);
      if (next.step === "landed") {
        if (candidate !== head) await this.upstream.takeRebased(head, candidate);
        this.pushed();
        await this.upstream.refreshUnpushed();
        return undefined;
      }
      if (next.step === "fail") return this.pushFailed(next.message);
      s.log("info", "the push was rejected: the remote moved", "push", { attempt, detail: result.outcome === "rejected" ? result.message : "" });
      const rebased = next.step === "side-branch" ? next.why : await this.upstream.rebaseOntoUpstream(head);
      if (typeof rebased === "string") {
        await this.upstream.moveToSideBranch(rebased);
        candidate = head;
      } else {
        candidate = rebased.commit;
      }
    }
    return undefined;
  }

  /**
   * Records the modes, owners and empty directories of the paths the watcher
   * saw on top of the remote's refs/git-csi/metadata, which other volumes of
   * the repository update too: a refused compare-and-swap fetches and records again.
   */
  private async pushMetadata(): Promise<void> {
    const s = this.s;
    for (let attempt = 0; s.metadataChanged.size > 0; attempt++) {
      const recorded = [...s.metadataChanged];
      const base = await revParse(s.repo, UPSTREAM_METADATA);
      const commit = await recordMetadata({
        repo: s.repo,
        treeDir: s.treeDir,
        branch: s.branch,
        base,
        changedPaths: recorded,
        indexFile: path.join(s.volumeDir, "metadata.index"),
        author: s.policy!.author,
        tree: s.tree,
      });
      const result = commit === base ? ({ outcome: "pushed" } as const) : await s.fenced((repo, fence) => pushMetadata(repo, commit, fence), [commit]);
      const next = afterMetadataPush(result, attempt);
      if (next === "done") {
        for (const p of recorded) s.metadataChanged.delete(p);
        return;
      }
      if (next === "give-up") {
        s.log("warn", `${METADATA_REF} was not pushed; the next push records it again: ${result.outcome === "pushed" ? "" : result.message}`, "metadata");
        return;
      }
      await s.remote((repo) => fetchMetadata(repo));
    }
  }

  private pushed(): void {
    const s = this.s;
    s.lastPushAt = Date.now();
    s.lastPushError = "";
    // A push lands on top of upstream: whatever moved under the uncommitted writes is now in the tree's history.
    s.upstreamMovedOverWrites = false;
    s.unpushed = 0;
    this.report.emit(Reason.Pushed, "Normal", `pushed to ${s.pushBranch}`);
    this.scheduler.pushed(s.pending.size > 0);
    this.report.publishMetrics();
  }

  pushFailed(message: string): SyncOutcome {
    const s = this.s;
    s.pushFailures++;
    s.lastPushError = message;
    s.ctx.metrics.pushFailures.inc(s.labels);
    this.report.emit(Reason.PushFailed, "Warning", `push to ${s.pushBranch} failed; the commits stay in the node's work tree and the driver retries: ${message}`);
    this.scheduler.failed(s.pushFailures);
    this.report.publishMetrics();
    return { pushed: false, message };
  }
}
