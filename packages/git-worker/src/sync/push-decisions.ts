/**
 * The push's decisions, spec 004 "When upstream moves", apart from the git
 * that carries them out: whether to push at all, and what a push's answer
 * leads to.
 */
import type { PushResult } from "../remote/remote";

/** How many rebases a rejected push gets before the volume moves to its side branch. */
export const REBASE_ATTEMPTS = 3;
/** The trigger of a flush: the pod stopped, and nothing else will push. */
export const POD_STOPPED = "the pod stopped";
/** The trigger of a flush for a snapshot or a clone of the volume. */
export const FLUSH_ASKED = "a snapshot or a clone asked for a flush";

export interface SyncOutcome {
  pushed: boolean;
  message: string;
}

export const NO_CREDENTIAL = "the driver restarted and holds no credential for the volume until the next publish brings the Secret";

/** A volume without its credential: at pod stop a push it owes is a failure; a timed push just waits. */
export function withoutCredential(trigger: string, unpushed: number): { fail: string } | { wait: SyncOutcome } {
  if (trigger === POD_STOPPED && unpushed > 0) return { fail: NO_CREDENTIAL };
  return { wait: { pushed: unpushed === 0, message: NO_CREDENTIAL } };
}

/** What the remote lacks: commits, the ref itself (deleted upstream), or recorded metadata. */
export function somethingToPush(unpushed: number, refDeleted: boolean, metadataChanged: number): boolean {
  return commitsToPush(unpushed, refDeleted) || metadataChanged > 0;
}

/** A deleted ref is pushed again even with no new commit: the volume's history must stay on the remote. */
export function commitsToPush(unpushed: number, refDeleted: boolean): boolean {
  return unpushed > 0 || refDeleted;
}

export type AfterPush = { step: "landed" } | { step: "fail"; message: string } | { step: "rebase" } | { step: "side-branch"; why: string };

/**
 * What a push's answer leads to. A rejection means the remote moved: rebase
 * onto it, up to REBASE_ATTEMPTS times, then the side branch; but a side
 * branch that moved is someone else's push, and the volume cannot choose.
 */
export function afterPush(result: PushResult, attempt: number, sideBranch: string | undefined): AfterPush {
  if (result.outcome === "pushed") return { step: "landed" };
  if (result.outcome === "failed") return { step: "fail", message: result.message };
  if (sideBranch !== undefined) return { step: "fail", message: `the side branch ${sideBranch} moved on the remote: ${result.message}` };
  if (attempt === REBASE_ATTEMPTS) return { step: "side-branch", why: `the push was still rejected after ${REBASE_ATTEMPTS} rebases` };
  return { step: "rebase" };
}
