import * as path from "node:path";
import { METADATA_REF, Reason } from "@git-csi/config";
import type { Committed } from "./commit";
import { recordMetadata } from "../metadata/record";
import { afterPush, commitsToPush, REBASE_ATTEMPTS, somethingToPush, type SyncOutcome, withoutCredential } from "./push-decisions";
import { branchChange, deleteRefs, metadataChange, pushChanges, pushUpdates, RemoteError, STAGE_BYTES } from "../remote/remote";
import type { VolumeReporter } from "../report";
import type { SyncScheduler } from "./schedule";
import { UPSTREAM_METADATA } from "../trees/store";
import type { VolumeStranded } from "./stranded";
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
    private readonly stranded: VolumeStranded,
  ) {}

  /**
   * Any failure to reach the remote on the way (a fetch, the metadata, the
   * push itself) is a failed push. `head`: the commit HEAD names, when the
   * commit just before this push made it.
   */
  async push(trigger: string, head?: Committed): Promise<SyncOutcome> {
    try {
      // A whole push, fetch and rebase included, holds the URL's repository: volumes of one URL take turns.
      return await this.s.ctx.onRepository(() => this.pushOnce(trigger, head).finally(() => this.deleteSentAhead()));
    } catch (err) {
      if (err instanceof RemoteError) return this.pushFailed(err.message);
      throw err;
    }
  }

  /**
   * The push is over, landed or not: the staging refs it sent objects ahead
   * to and no landed push deleted go now, each a compare-and-swap from what
   * it sent. One the remote keeps (it did not answer) waits for the collection.
   */
  private async deleteSentAhead(): Promise<void> {
    const left = this.s.lease.takeSentAhead();
    if (left.length === 0) return;
    try {
      const { deleted, kept } = await this.s.remote((repo) => deleteRefs(repo, left));
      for (const ref of deleted) this.s.log("info", `deleted ${ref}: the push it held objects for is over`, "gc", { ref });
      if (kept.length > 0) this.s.log("warn", `kept ${kept.join(", ")}: they moved since this push sent them`, "gc", { refs: kept });
    } catch (err) {
      this.s.log("warn", `the staging refs ${left.map((r) => r.ref).join(", ")} stay on the remote until the next collection: ${(err as Error).message}`, "gc");
    }
  }

  private async pushOnce(trigger: string, committed: Committed | undefined): Promise<SyncOutcome> {
    const s = this.s;
    this.scheduler.pushStarts();
    if (s.waitingForCredential) {
      const decision = withoutCredential(trigger, s.unpushed);
      return "fail" in decision ? this.pushFailed(decision.fail) : decision.wait;
    }
    // A heal moves HEAD.
    const head = s.onSideBranch ? undefined : committed;
    if (s.onSideBranch) await this.upstream.tryToHeal();
    if (!somethingToPush(s.unpushed, s.refDeleted, s.metadataChanged.size)) return { pushed: true, message: "nothing to push" };
    // The only commit the remote lacks sits on what the last push left there: the push expects that, and nobody asks git.
    const landedOn = head && s.unpushed === 1 && !s.refDeleted ? head.parent : undefined;
    const failed = await this.pushChanges(head?.commit ?? (await s.head()), landedOn);
    if (failed) return failed;
    return { pushed: true, message: `pushed to ${s.pushBranch}` };
  }

  /**
   * One atomic push of what the remote lacks, with the owner ref's renewal:
   * the tree's HEAD, or its rebase onto a ref that moved, and the metadata
   * record of the paths the watcher saw. A rejection fetches the branch and
   * refs/git-csi/metadata once. Only a moved branch is a rebase, and counts
   * toward the side branch; a moved metadata ref (other volumes of the
   * repository record on it too) is recorded on again, a few times, then the
   * commits go without it. The rebased commit goes out straight from the
   * scratch worktree; the pod's tree takes it once it landed. Answers the
   * failure, or nothing once everything landed. `landedOn`: where the branch
   * is expected to be, a commit `head` contains, when the caller knows.
   */
  private async pushChanges(head: string, landedOn?: string): Promise<SyncOutcome | undefined> {
    const s = this.s;
    let candidate = head;
    let branchAt = landedOn;
    let metadata = await this.recordMetadata();
    for (let rebases = 0, retries = 0; ;) {
      const withCommits = commitsToPush(s.unpushed, s.refDeleted);
      if (!withCommits && !metadata) return undefined;
      const changes = [...(withCommits ? [branchChange(candidate, s.pushBranch, branchAt)] : []), ...(metadata ? [metadataChange(metadata.commit, metadata.base)] : [])];
      // Only a push that may be large asks git what it would send: that walk costs more than a small push saves.
      const mayBeLarge = s.unpushedBytes > STAGE_BYTES || candidate !== head || metadata?.base === "";
      const result = await s.fenced((repo, fence) => pushChanges(repo, changes, fence), mayBeLarge ? changes : []);
      if (result.outcome === "pushed") {
        for (const p of metadata?.recorded ?? []) s.metadataChanged.delete(p);
        if (withCommits) await this.landed(head, candidate);
        return undefined;
      }
      if (result.outcome === "failed") return this.pushFailed(result.message);
      s.log("info", "the push was rejected: the remote moved", "push", { rebases, retries, detail: result.message });
      // What the branch holds now is what the fetch below tells, no longer what the last push left.
      branchAt = undefined;
      const moved = await this.upstream.whatMoved(candidate, metadata?.base);
      if (withCommits && moved.branch) {
        const next = afterPush(result, rebases++, s.onSideBranch ? s.sideBranch : undefined);
        if (next.step === "fail") return this.pushFailed(next.message);
        const rebased = next.step === "side-branch" ? next.why : await this.upstream.rebaseOntoUpstream(head, moved.missing);
        if (typeof rebased === "string") {
          await this.upstream.moveToSideBranch(rebased);
          candidate = head;
        } else {
          candidate = rebased.commit;
        }
      } else if (++retries >= REBASE_ATTEMPTS) {
        // Nothing to rebase, yet rejected again and again: what moved is shared with other volumes, or the fence.
        if (!metadata) return this.pushFailed(`the push was rejected ${retries} times though ${s.pushBranch} did not move: ${result.message}`);
        s.log("warn", `${METADATA_REF} kept moving: it is not pushed now, and the next push records it again`, "metadata");
        metadata = undefined;
        continue;
      }
      // A record on a metadata ref that did not move goes again as it is: recording costs git processes between the fetch and the push.
      if (metadata && moved.metadata) metadata = await this.recordMetadata();
    }
  }

  private async landed(head: string, candidate: string): Promise<void> {
    if (candidate !== head) await this.upstream.takeRebased(head, candidate);
    this.pushed();
    await this.stranded.settle(candidate);
    // HEAD itself landed: nothing is left to count. A tree that could not take a rebased commit keeps commits the remote lacks.
    if (candidate !== head) await this.upstream.refreshUnpushed();
  }

  /**
   * The modes, owners and empty directories of the paths the watcher saw,
   * recorded on the node's view of refs/git-csi/metadata: no fetch, the push's
   * compare-and-swap tells when the remote moved. Undefined when it changes nothing.
   */
  private async recordMetadata(): Promise<{ commit: string; base: string; recorded: string[] } | undefined> {
    const s = this.s;
    if (s.metadataChanged.size === 0) return undefined;
    const recorded = [...s.metadataChanged];
    const base = await s.repoRef(UPSTREAM_METADATA);
    const commit = await recordMetadata({
      gitDir: s.ctx.store.repoDir(s.ctx.source.url),
      cache: s.ctx.store.listings,
      treeDir: s.treeDir,
      branch: s.branch,
      base,
      changedPaths: recorded,
      indexFile: path.join(s.volumeDir, "metadata.index"),
      author: s.policy!.author,
      tree: s.tree,
      notIgnored: s.committedPaths,
      inSubmodule: (p, submodule) => this.report.notServed(p, `is inside the submodule ${submodule}, which the driver does not serve: it is not committed`),
    });
    if (commit !== base) return { commit, base, recorded };
    for (const p of recorded) s.metadataChanged.delete(p);
    return undefined;
  }

  private pushed(): void {
    const s = this.s;
    s.lastPushAt = Date.now();
    s.lastPushError = "";
    // A push lands on top of upstream: whatever moved under the uncommitted writes is now in the tree's history.
    s.upstreamMovedOverWrites = false;
    s.unpushed = 0;
    s.unpushedBytes = 0;
    s.committedPaths.clear();
    this.report.emit(Reason.Pushed, "Normal", `pushed to ${s.pushBranch}`);
    this.scheduler.pushed(s.pending.size > 0);
    this.report.publishMetrics();
  }

  /**
   * The flushed marker at HEAD, once the remote holds every commit of the
   * tree: the controller makes a snapshot or a clone from it. Unfenced: it
   * moves nothing the owner ref guards, and names a commit the epoch pushed.
   */
  async pushMarker(ref: string): Promise<SyncOutcome> {
    const s = this.s;
    if (s.unpushed > 0) return { pushed: false, message: `${s.unpushed} commit(s) of the tree are not on the remote; ${ref} waits for the next flush` };
    const head = await s.head();
    const result = await s.ctx.onRepository(() => s.remote((repo) => pushUpdates(repo, [{ ref, expected: "", next: head }])));
    if (result.outcome !== "pushed") return { pushed: false, message: `pushing ${ref} failed: ${result.message}` };
    s.log("info", `pushed ${ref} at ${head.slice(0, 12)}`, "mark_flushed");
    return { pushed: true, message: `pushed ${ref}` };
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
