// The owner ref of spec 000 as a test reads it, and another node's epoch
// taking it over by compare-and-swap, as a successor's claim does.
import { randomUUID } from "node:crypto";
import type { GitServer } from "./git-server";

/** Owner record fields, as the git worker's formatRecord writes them. */
export type OwnerFields = Record<string, string>;

export async function ownerRecord(server: GitServer, repo: string, volumeId: string): Promise<OwnerFields | undefined> {
  const text = await server.git(repo, "show", "-s", "--format=%B", `refs/git-csi/owner/${volumeId}`).catch(() => undefined);
  if (text === undefined) return undefined;
  return Object.fromEntries([...text.matchAll(/^([a-z-]+): (\S+)/gm)].map((m) => [m[1]!, m[2]!]));
}

/**
 * Another node's epoch takes the owner ref, by compare-and-swap against
 * whatever record is there now (a renewal may land in between: tried again).
 * Resolves to the record it replaced and the successor.
 */
export async function takeOver(server: GitServer, repo: string, volumeId: string): Promise<{ replaced: OwnerFields | undefined; successor: { node: string; epoch: string } }> {
  const ref = `refs/git-csi/owner/${volumeId}`;
  const emptyTree = await server.git(repo, "hash-object", "-t", "tree", "-w", "/dev/null");
  const successor = { node: "node-other", epoch: randomUUID() };
  for (let attempt = 0; ; attempt++) {
    const old = await server.git(repo, "rev-parse", ref);
    const current = await ownerRecord(server, repo, volumeId);
    const now = Math.max(Date.now(), Number(current?.time));
    const commit = await server.git(repo, "commit-tree", emptyTree, "-m", takenOver(await server.git(repo, "show", "-s", "--format=%B", old), successor, now));
    try {
      await server.git(repo, "update-ref", ref, commit, old);
      return { replaced: current, successor };
    } catch (err) {
      if (attempt > 5) throw err;
    }
  }
}

/** Another node's record, made from the current one: the git worker's own format, with the successor's node, epoch and times. */
function takenOver(record: string, successor: { node: string; epoch: string }, now: number): string {
  const set = (text: string, key: string, value: string) => text.replace(new RegExp(`^${key}: .*$`, "m"), `${key}: ${value}`);
  const at = (t: number) => `${t} (${new Date(t).toISOString()})`;
  return set(set(set(set(record, "node", successor.node), "epoch", successor.epoch), "time", at(now)), "expires", at(now + 60_000));
}
