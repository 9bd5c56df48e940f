import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { promisify } from "node:util";
import { deflate } from "node:zlib";

/*
 * git's loose files, read and written in the worker's own process where a
 * git process would cost more than the work: a ref's oid on the way to a
 * push, and an owner record's commit object. Anything these cannot settle
 * (a packed ref, another ref format) is left to git.
 */

const deflated = promisify(deflate);

/** A full SHA-1 object id: the worker's repositories are SHA-1 (see lease.ts's EMPTY_TREE). */
const OID = /^[0-9a-f]{40}$/;

/** Where a repository keeps its files: a worktree has its own HEAD, and shares every other ref with the bare repository. */
export interface RefFiles {
  gitDir: string;
  commonDir: string;
}

/**
 * The oid a ref names, read from its loose file, one symbolic step
 * followed (HEAD → its branch). git replaces a loose ref by renaming a lock
 * file over it, so a read sees the old oid or the new one, never half.
 * Undefined where the file does not settle it: a packed ref, no ref, or a
 * ref format without loose files. The caller asks git then.
 */
export async function looseRef(at: RefFiles, ref: string, followed = false): Promise<string | undefined> {
  const text = await fs.readFile(path.join(ref === "HEAD" ? at.gitDir : at.commonDir, ref), "utf8").catch(() => undefined);
  const value = text?.trim();
  if (value === undefined) return undefined;
  if (OID.test(value)) return value;
  const target = /^ref: (refs\/[^\s]+)$/.exec(value)?.[1];
  return target !== undefined && !followed ? looseRef(at, target, true) : undefined;
}

/**
 * Writes an object as `git hash-object -w -t <type> --no-filters` does, and
 * answers its oid: the deflated object in a temporary file beside its place,
 * then linked there, so a reader never sees half an object. An object
 * already there is kept: the same oid is the same content.
 */
export async function writeLooseObject(objectsDir: string, type: "blob" | "commit", content: string): Promise<string> {
  const body = Buffer.from(content, "utf8");
  const raw = Buffer.concat([Buffer.from(`${type} ${body.length}\0`, "utf8"), body]);
  const oid = createHash("sha1").update(raw).digest("hex");
  const dir = path.join(objectsDir, oid.slice(0, 2));
  await fs.mkdir(dir, { recursive: true });
  // git's own prefix for its temporary objects: its gc removes one a crash left behind.
  const temporary = path.join(dir, `tmp_obj_${randomBytes(6).toString("hex")}`);
  await fs.writeFile(temporary, await deflated(raw), { mode: 0o444 });
  try {
    await fs.link(temporary, path.join(dir, oid.slice(2)));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  } finally {
    await fs.rm(temporary, { force: true });
  }
  return oid;
}
