import { status } from "@grpc/grpc-js";
import { asCsiError, gitWorker, required } from "@git-csi/protos";
import type { SimpleGit } from "simple-git";
import { CAS_ATTEMPTS, type HeldLease, monotonic, type MountLease, type OnRemote, writeRecords } from "./lease";
import { fetchOwners, pushUpdates, RemoteError } from "../remote/remote";
import { ownerRef } from "../trees/store";

/**
 * renew_mount of spec 000 for many volumes at once. The mount owner asks once
 * per renewal interval for every epoch it holds; the volumes that reach one
 * remote with one credential renew in one atomic push of their owner refs,
 * each a compare-and-swap from the record its lease last wrote. So the
 * remote sees one push per interval, whatever the number of volumes.
 */

/**
 * How long a batch waits for a lease busy with a step of its own (a claim,
 * the fenced update of a push, which renews it too) before the others go
 * without it.
 */
const JOIN_BUDGET_MS = 5_000;

/** What a batch renewal needs of one staged volume. */
export interface RenewalMember {
  lease: MountLease;
  /** Volumes with the same key reach the same remote with the same credential. */
  key: string;
  remote: OnRemote;
  /** git in the URL's bare repository, where the records are written: made for one member of a batch only, as it costs a git client. */
  local(): SimpleGit;
  /** The batch is over: the volume's report follows the lease. */
  renewed(): void;
}

/** The worker's staged volume of a request, and whether the request's epoch is the one it serves. */
export type FindMember = (volumeId: string, epoch: string) => RenewalMember | gitWorker.RenewedMount;

/**
 * RenewMounts: answers each requested mount in order. A volume whose epoch
 * lost its lease is answered with the refusal and left out of the push; a
 * remote that fails answers its volumes with the failure, never the others.
 */
export async function renewMounts(request: gitWorker.RenewMountsRequest, find: FindMember): Promise<gitWorker.RenewMountsResponse> {
  // Every field is checked before anything is renewed.
  request.mounts.forEach((m, i) => {
    required(m.volumeId, `mounts[${i}].volume_id`);
    required(m.epoch, `mounts[${i}].epoch`);
  });
  const answers = request.mounts.map((m) => find(m.volumeId, m.epoch));
  const groups = new Map<string, RenewalMember[]>();
  for (const answer of answers) if (isMember(answer)) groups.set(answer.key, [...(groups.get(answer.key) ?? []), answer]);
  const failures = new Map<RenewalMember, gitWorker.RenewedMount>();
  await Promise.all(
    [...groups.values()].map((members) =>
      renewTogether(
        members.map((m) => m.lease),
        members[0]!.remote,
        members[0]!.local(),
      ).catch((err: unknown) => {
        const failure = asCsiError(err);
        const code = err instanceof RemoteError ? status.UNAVAILABLE : failure.code;
        const error = `the renewal of ${members.length} volume(s) on this remote failed; each mount serves until its lease's end unless a later renewal succeeds: ${failure.message}`;
        for (const m of members) failures.set(m, { volumeId: m.lease.holder.volumeId, code, error });
      }),
    ),
  );
  return {
    mounts: answers.map((answer) => {
      if (!isMember(answer)) return answer;
      answer.renewed();
      return failures.get(answer) ?? { volumeId: answer.lease.holder.volumeId, lease: answer.lease.state(), code: status.OK, error: "" };
    }),
  };
}

function isMember(answer: RenewalMember | gitWorker.RenewedMount): answer is RenewalMember {
  return "key" in answer;
}

/**
 * Renews leases of one remote and credential together. Each lease joins once
 * its earlier steps finished; one still busy after joinBudgetMs is left out
 * (its own step's push renews it, or the next batch does). Throws when the
 * remote could not be reached: then no lease changed.
 */
export async function renewTogether(leases: MountLease[], remote: OnRemote, local: SimpleGit, joinBudgetMs = JOIN_BUDGET_MS): Promise<void> {
  const joined: HeldLease[] = [];
  let closed = false;
  let allJoined!: () => void;
  const gathered = new Promise<void>((resolve) => (allJoined = resolve));
  let release!: () => void;
  const done = new Promise<void>((resolve) => (release = resolve));
  for (const lease of leases) {
    void lease.hold(async (held) => {
      if (closed) return;
      joined.push(held);
      if (joined.length === leases.length) allJoined();
      await done;
    });
  }
  const budget = setTimeout(allJoined, joinBudgetMs);
  await gathered;
  clearTimeout(budget);
  closed = true;
  try {
    await pushRenewals([...joined], remote, local);
  } finally {
    release();
  }
}

/**
 * One atomic push of every renewal, each ref a compare-and-swap. When the
 * remote refuses it whole, the refs that moved are fetched: a lease whose
 * record another epoch replaced drops out, and the rest push again.
 */
async function pushRenewals(held: HeldLease[], remote: OnRemote, local: SimpleGit): Promise<void> {
  let members = held;
  for (let attempt = 0; attempt < CAS_ATTEMPTS; attempt++) {
    const renewals = members.flatMap((lease) => {
      const record = lease.renewal();
      return record ? [{ lease, record }] : [];
    });
    if (renewals.length === 0) return;
    const oids = await writeRecords(
      local,
      renewals.map((r) => r.record),
    );
    const updates = renewals.map((r, i) => ({ ref: ownerRef(r.lease.volumeId), expected: r.lease.expected(), next: oids[i]! }));
    const sent = monotonic();
    const result = await remote((repo) => pushUpdates(repo, updates));
    if (result.outcome === "pushed") {
      renewals.forEach((r, i) => r.lease.took(oids[i]!, r.record, sent));
      return;
    }
    if (result.outcome === "failed") throw new RemoteError(`the push of ${updates.length} owner ref(s) failed: ${result.message}`);
    const now = await remote((repo) =>
      fetchOwners(
        repo,
        renewals.map((r) => r.lease.volumeId),
      ),
    );
    for (const { lease } of renewals) {
      const oid = now.get(lease.volumeId)!;
      if (oid !== lease.expected()) await lease.load(oid);
    }
    members = renewals.map((r) => r.lease);
  }
  throw new RemoteError(`the owner refs kept moving under ${CAS_ATTEMPTS} compare-and-swap attempts`);
}
