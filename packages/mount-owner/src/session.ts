import { randomUUID } from "node:crypto";
import * as fs from "node:fs/promises";
import { orAbsent } from "@git-csi/config";
import { failedPrecondition, type gitcsi } from "@git-csi/protos";
import { writeFileAtomic } from "./state";

/**
 * The `.rwo-session` record of spec 000, beside the staging directory: what a
 * retried or restarted stage needs to continue the same mount session. It
 * holds identities only, never a credential, and is never logged.
 */
export interface SessionRecord {
  volumeId: string;
  /** Counts the sessions this node began for the volume. */
  generation: number;
  node: string;
  endpoints: { mountOwner: string; gitWorker: string };
  /** The mount epoch: random per session, reused by every retry of its stage. */
  epoch: string;
  accessMode: gitcsi.AccessMode;
  /** Durable before NodeStageVolume reports success. */
  completed: boolean;
}

/** Whose session a stage or unstage expects to find; the access mode where the request names one. */
export interface SessionIdentity {
  volumeId: string;
  node: string;
  accessMode?: gitcsi.AccessMode;
}

export function sessionPath(stagingPath: string): string {
  return `${stagingPath.replace(/\/+$/, "")}.rwo-session`;
}

/**
 * The record at a staging path, or undefined where there is none. A symlink, a
 * mode other than 0600, an unreadable record, or one of another volume, node
 * or access mode is refused: the stage cannot tell whose session it would continue.
 */
export async function readSession(stagingPath: string, identity: SessionIdentity): Promise<SessionRecord | undefined> {
  const { volumeId } = identity;
  const file = sessionPath(stagingPath);
  const stat = await orAbsent(fs.lstat(file));
  if (!stat) return undefined;
  const refuse = (why: string) =>
    failedPrecondition(`${file} ${why}; the stage of volume ${volumeId} cannot continue its session. Check that no mount of the volume remains (unpublish and unstage it), then remove the file`);
  if (stat.isSymbolicLink()) throw refuse("is a symlink");
  if (!stat.isFile()) throw refuse("is not a regular file");
  if ((stat.mode & 0o777) !== 0o600) throw refuse(`has mode ${(stat.mode & 0o777).toString(8)}, not 600`);
  let record: SessionRecord;
  try {
    record = JSON.parse(await fs.readFile(file, "utf8")) as SessionRecord;
  } catch {
    throw refuse("cannot be read as a session record");
  }
  if (typeof record.epoch !== "string" || typeof record.completed !== "boolean") throw refuse("cannot be read as a session record");
  if (record.volumeId !== volumeId) throw refuse("belongs to another volume");
  if (record.node !== identity.node) throw refuse(`belongs to node ${record.node}, not ${identity.node}`);
  if (identity.accessMode !== undefined && record.accessMode !== identity.accessMode) throw refuse("was written for another access mode");
  return record;
}

export function writeSession(stagingPath: string, record: SessionRecord): Promise<void> {
  return writeFileAtomic(sessionPath(stagingPath), `${JSON.stringify(record)}\n`, 0o600);
}

export async function removeSession(stagingPath: string): Promise<void> {
  await fs.rm(sessionPath(stagingPath), { force: true });
}

/** A new session's record: a fresh epoch, the next generation, not yet completed. */
export function newSession(base: Omit<SessionRecord, "epoch" | "completed" | "generation">, previousGeneration: number): SessionRecord {
  return { ...base, generation: previousGeneration + 1, epoch: randomUUID(), completed: false };
}
