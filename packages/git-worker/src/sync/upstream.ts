import * as fs from "node:fs/promises";
import * as path from "node:path";
import { orAbsent, Reason } from "@git-csi/config";
import type { SimpleGit } from "simple-git";
import { runGit } from "../remote/git";
import { replayMetadata } from "../metadata/replay";
import { deleteBranch, fetchBranch, fetchMetadata } from "../remote/remote";
import type { VolumeReporter } from "../report";
import type { SyncScheduler } from "./schedule";
import { type PreparedTree, volumeBranchRef } from "../trees/stage";
import { UPSTREAM_METADATA, upstreamRef } from "../trees/store";
import { canMoveTree, countCommits, holdsChanges, isAncestor, moveTree, revParse, statusOf } from "../remote/tree";
import type { VolumeState } from "./volume";

/**
 * The volume against its ref, spec 004 "When upstream moves": what the
 * remote lacks, the rebase in the scratch worktree, the side branch, and the
 * return from it once a person merged it.
 */
export class VolumeUpstream {
  constructor(
    private readonly s: VolumeState,
    private readonly report: VolumeReporter,
    private readonly scheduler: SyncScheduler,
  ) {}

  /** Counts the commits the push branch lacks: a side branch not (or no longer) on the remote lacks what the ref lacks. */
  async refreshUnpushed(): Promise<void> {
    const s = this.s;
    const head = await revParse(s.tree, "HEAD");
    const pushed = (await revParse(s.repo, upstreamRef(s.pushBranch))) || (s.onSideBranch ? await revParse(s.repo, upstreamRef(s.branch)) : "");
    s.unpushed = head === "" ? 0 : await countCommits(s.repo, pushed, head);
    if (s.unpushed === 0) s.unpushedBytes = 0;
    if (s.unpushed === 0 && s.pending.size === 0) this.scheduler.caughtUp();
    this.report.publishMetrics();
  }

  /**
   * Spec 004, "When upstream moves", at stage: behind takes upstream, ahead
   * changes nothing, diverged rebases (or moves to the side branch), and a
   * tree with uncommitted writes is left as it is whatever upstream did. A
   * side branch on the remote means the volume still pushes there, unless a
   * person merged it.
   */
  async reconcileAtStage(fetched: PreparedTree["fetched"]): Promise<void> {
    const s = this.s;
    // The side branch the node last pushed tells where pushes go until a fetch tells more, even one the forge deleted since.
    const sidePushed = (await revParse(s.repo, upstreamRef(s.sideBranch))) !== "";
    if (fetched === "skipped") {
      s.onSideBranch = sidePushed;
      return;
    }
    if (fetched === "missing") {
      // Pushes go to the side branch: its compare-and-swap needs the remote's side branch as it is.
      await s.remote((repo) => fetchBranch(repo, s.sideBranch));
      s.onSideBranch = true;
      this.noteRefDeleted();
      return;
    }
    // Another node may have pushed the side branch; tryToHeal fetches it again, after it read what this node pushed.
    s.onSideBranch = sidePushed || (await s.remote((repo) => fetchBranch(repo, s.sideBranch))) === "fetched";
    if (s.onSideBranch) {
      // A heal moves the tree: where the mount cannot be synced now, the next push heals.
      if (await s.syncMountAtStage()) await this.tryToHeal();
      if (s.onSideBranch) this.report.emit(Reason.Diverged, "Warning", `the volume pushes to ${s.sideBranch} until it is merged into ${s.branch} on the forge`);
      return;
    }
    await this.followUpstreamAtStage();
  }

  /** Behind, ahead or diverged from the ref that was just fetched, with a clean tree. */
  private async followUpstreamAtStage(): Promise<void> {
    const s = this.s;
    const head = await revParse(s.tree, "HEAD");
    const upstream = await revParse(s.repo, upstreamRef(s.branch));
    if (head === upstream || (await isAncestor(s.repo, upstream, head))) return;
    if (!(await s.syncMountAtStage())) return;
    if ((await statusOf(s.tree)).length > 0) {
      this.report.noteUpstreamMoved();
      return;
    }
    if (await isAncestor(s.repo, head, upstream)) {
      await this.moveTree(head, upstream);
      s.log("info", "the tree took upstream", "stage", { from: head, to: upstream });
      return;
    }
    const rebased = await this.rebaseInScratch(head, upstream);
    if (rebased === undefined || !(await this.moveTree(head, rebased))) {
      await this.moveToSideBranch(`the tree and ${s.branch} diverged and rebasing at stage conflicted`);
      return;
    }
    this.report.emit(Reason.Rebased, "Normal", `${s.branch} moved upstream while the volume was away; its commits were rebased onto it at stage`);
  }

  /** A restore: a new tree takes the modes, owners and empty directories the metadata ref recorded. */
  async replayMetadata(): Promise<void> {
    const s = this.s;
    const metadata = await s.remote((repo) => fetchMetadata(repo));
    if (metadata === "") return;
    const result = await replayMetadata({
      repo: s.repo,
      treeDir: s.treeDir,
      branch: s.branch,
      metadata,
      log: (message, fields) => s.log("warn", message, "replay_metadata", fields),
    });
    s.log("info", "replayed modes, owners and empty directories", "replay_metadata", { applied: result.applied, refused: result.refused.length });
  }

  /**
   * After a rejected push, one fetch tells what moved: the branch, and
   * refs/git-csi/metadata, which every volume of the repository records on.
   * The branch moved when it holds a commit `candidate` lacks, or is gone;
   * then a rebase is due. The side branch is the volume's own and is never
   * rebased: there, a rejection the metadata ref does not explain is the
   * branch's. `metadataBase`: where the push's record was made, if it had one.
   */
  async whatMoved(candidate: string, metadataBase: string | undefined): Promise<{ branch: boolean; metadata: boolean; missing: boolean }> {
    const s = this.s;
    const metadataMoved = async () => metadataBase !== undefined && (await revParse(s.repo, UPSTREAM_METADATA)) !== metadataBase;
    if (s.onSideBranch) {
      await s.remote((repo) => fetchMetadata(repo));
      const metadata = await metadataMoved();
      return { branch: !metadata, metadata, missing: false };
    }
    const missing = (await s.remote((repo) => fetchBranch(repo, s.branch, true))) === "missing";
    const branch = missing || !(await isAncestor(s.repo, await revParse(s.repo, upstreamRef(s.branch)), candidate));
    return { branch, metadata: await metadataMoved(), missing };
  }

  /**
   * Rebases the tree's commits onto the ref whatMoved just fetched, in the
   * scratch worktree beside the pod's tree; the pod's tree moves to the
   * result once it landed. Returns why it could not, for the side branch's message.
   */
  async rebaseOntoUpstream(head: string, missing: boolean): Promise<{ commit: string } | string> {
    const s = this.s;
    if (missing) {
      this.noteRefDeleted();
      return `${s.branch} was deleted upstream`;
    }
    const upstream = await revParse(s.repo, upstreamRef(s.branch));
    const rebased = await this.rebaseInScratch(head, upstream);
    if (rebased === undefined) return `rebasing onto ${s.branch} conflicted and was aborted`;
    await s.ctx.syncMount();
    if (!(await canMoveTree(s.tree, head, rebased))) return "a file the application changed since the last commit was also changed upstream";
    return { commit: rebased };
  }

  private noteRefDeleted(): void {
    this.s.refDeleted = true;
    this.report.emit(Reason.RefDeleted, "Warning", `${this.s.branch} was deleted upstream; the volume's commits go to ${this.s.sideBranch} so nothing is lost`);
  }

  /**
   * Commits a lost mount epoch left on a stranded ref, replayed onto the
   * tree; false, and nothing moved, where they conflict with it.
   */
  async takeStranded(head: string, stranded: string): Promise<boolean> {
    const base = (await runGit(this.s.repo, ["merge-base", head, stranded])).trim();
    const rebased = await this.rebaseInScratch(stranded, head, base);
    return rebased !== undefined && (await this.moveTree(head, rebased));
  }

  /** The pod's tree takes a rebased commit that landed, in one step. */
  async takeRebased(head: string, rebased: string): Promise<void> {
    if (await this.moveTree(head, rebased)) {
      this.report.emit(Reason.Rebased, "Normal", `${this.s.branch} moved upstream; the volume's commits were rebased onto it and the pod's tree took upstream's files`);
    } else {
      // The application wrote a file upstream changed after the check: the next cycle's rebase decides.
      this.s.log("warn", "the pod's tree keeps its commit until the next cycle: the application changed a file upstream changed too", "rebase");
    }
  }

  /**
   * The tree moves in one step once the mount's pages reached it: git keeps
   * what the application wrote only if it sees it, and a write can wait in
   * the kernel's writeback cache. False, and nothing written, where git refuses.
   */
  private async moveTree(head: string, to: string): Promise<boolean> {
    await this.s.ctx.syncMount();
    if (!(await moveTree(this.s.tree, volumeBranchRef(this.s.volumeId), head, to))) return false;
    await this.invalidateMount(to);
    return true;
  }

  /**
   * The kernel caches the mount's entries and attributes while the lease
   * serves: it forgets them before the move is reported. The move stands
   * either way; a mount owner that restarts forgets them all as it resumes.
   */
  private async invalidateMount(to: string): Promise<void> {
    try {
      await this.s.ctx.invalidateMount();
    } catch (err) {
      this.s.log("warn", `the mount may show files from before the tree moved until the kernel's cache of them runs out (at most 90 s): ${(err as Error).message}`, "invalidate_mount", { to });
    }
  }

  /**
   * The rebased commit, or undefined when the rebase conflicted (and was
   * aborted). Any other failure is git's error, never taken for a conflict.
   * `after`: only the commits after it are replayed, its own being in `onto`.
   */
  private async rebaseInScratch(head: string, onto: string, after?: string): Promise<string | undefined> {
    const git = await this.scratchAt(head);
    try {
      await runGit(git, ["rebase", "--quiet", ...(after === undefined ? [onto] : ["--onto", onto, after])]);
    } catch (err) {
      // Not a conflict: the next scratchAt aborts what is left, or makes the scratch again.
      if ((await runGit(git, ["diff", "--name-only", "--diff-filter=U"])).trim() === "") throw err;
      await runGit(git, ["rebase", "--abort"]);
      return undefined;
    }
    return revParse(git, "HEAD");
  }

  /**
   * The scratch worktree, checked out at head with no rebase in progress. It
   * holds nothing of its own, so one a killed worker left broken (a rebase
   * half done, a lock) is made again rather than trusted.
   */
  private async scratchAt(head: string): Promise<SimpleGit> {
    const s = this.s;
    const scratch = s.ctx.store.scratchDir(s.volumeId);
    // simple-git wants its directory to exist when it is made.
    const git = () => s.ctx.store.scratch(s.volumeId, s.authorEnv());
    if (await orAbsent(fs.stat(scratch))) {
      try {
        await runGit(git(), ["rebase", "--abort"]).catch((err: Error) => {
          if (!/no rebase in progress/i.test(err.message)) throw err;
        });
        await runGit(git(), ["checkout", "--quiet", "--force", "--detach", head]);
        return git();
      } catch (err) {
        s.log("warn", `the scratch worktree is made again: ${(err as Error).message}`, "rebase");
        await fs.rm(scratch, { recursive: true, force: true });
      }
    }
    await fs.mkdir(path.dirname(scratch), { recursive: true });
    await runGit(s.repo, ["worktree", "add", "--quiet", "--detach", "--force", scratch, head]);
    return git();
  }

  async moveToSideBranch(why: string): Promise<void> {
    const s = this.s;
    s.onSideBranch = true;
    this.report.emit(
      Reason.Diverged,
      "Warning",
      `${why}: the volume now pushes to ${s.sideBranch} instead of ${s.branch}; merge ${s.sideBranch} into ${s.branch} on the forge and the volume returns to ${s.branch} at its next push. Commits continue.`,
    );
    await this.refreshUnpushed();
  }

  /**
   * On the side branch: the volume returns to the ref once the ref holds
   * everything the side branch changed, whether a person merged it, squashed
   * it or rebased it in on the forge, and whether the forge then deleted it
   * or not. The commits the tree made since its last push to the side branch
   * are rebased onto the ref; where they conflict, the volume stays.
   */
  async tryToHeal(): Promise<void> {
    const s = this.s;
    // What this node last pushed there: the forge may have deleted the branch since, and the fetch drops the node's view with it.
    const sidePushed = await revParse(s.repo, upstreamRef(s.sideBranch));
    const sideDeleted = (await s.remote((repo) => fetchBranch(repo, s.sideBranch))) === "missing";
    if ((await s.remote((repo) => fetchBranch(repo, s.branch))) === "missing") return;
    s.refDeleted = false;
    const upstream = await revParse(s.repo, upstreamRef(s.branch));
    const head = await revParse(s.tree, "HEAD");
    // The side branch as the remote holds it (a person may have added to it), else as this node pushed it, else the tree's own commits.
    const side = (await revParse(s.repo, upstreamRef(s.sideBranch))) || sidePushed || head;
    if (!(await holdsChanges(s.repo, upstream, side)) || !(await this.returnToRef(head, upstream, side))) {
      if (sideDeleted) await this.keepDeletedSideBranch(sidePushed !== "");
      return;
    }
    if (!sideDeleted) {
      const deleted = await s.fenced((repo, fence) => deleteBranch(repo, s.sideBranch, fence));
      if (deleted.outcome !== "pushed") s.log("warn", `the merged side branch ${s.sideBranch} stays on the remote: ${deleted.message}`, "heal");
    }
    this.report.emit(Reason.Healed, "Normal", `${s.branch} holds everything ${s.sideBranch} changed: the volume is back on ${s.branch} and the side branch is ${sideDeleted ? "gone" : "deleted"}`);
    await this.refreshUnpushed();
  }

  /** The tree moves onto the ref with the commits it made after `side`; false, and nothing moved, where they conflict. */
  private async returnToRef(head: string, upstream: string, side: string): Promise<boolean> {
    const rebased = await this.rebaseInScratch(head, upstream, side);
    if (rebased === undefined || !(await this.moveTree(head, rebased))) return false;
    this.s.onSideBranch = false;
    return true;
  }

  /**
   * The forge deleted the side branch though the ref lacks some of what it
   * changed (deleted by hand, or a merge that left part of it out). Returning
   * to the ref would push those writes there unreviewed or drop them; the
   * side branch is the one place they wait for a person. So the volume stays
   * on it and pushes it again, with all its commits: no acknowledged write is
   * lost, and the forge shows it again. `seen`: this node had pushed it, so
   * this is news (a push that has not landed since says nothing again).
   */
  private async keepDeletedSideBranch(seen: boolean): Promise<void> {
    const s = this.s;
    if (seen) {
      this.report.emit(
        Reason.RefDeleted,
        "Warning",
        `${s.sideBranch} was deleted on the forge, but ${s.branch} does not hold everything it changed: the volume pushes ${s.sideBranch} again with all its commits, so nothing is lost; merge it into ${s.branch} and the volume returns to ${s.branch}`,
      );
    }
    await this.refreshUnpushed();
  }
}
