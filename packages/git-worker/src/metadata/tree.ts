import type { Stats } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { isAbsent, orAbsent } from "@git-csi/config";
import { chunks } from "../remote/git";
import { badName, baseName, entryOf, joinRel, type MetadataEntry, parentOf } from "./format";

/** How many lstat, chown or chmod calls run at once. */
const FS_BATCH = 256;

/**
 * lstat of tree-relative paths, never through a symlink: a path is seen only
 * when each directory on its way is a real directory. Cached for one call.
 */
export class TreeView {
  private readonly stats = new Map<string, Promise<Stats | null>>();

  constructor(readonly root: string) {}

  abs(rel: string): string {
    return rel === "" ? this.root : path.join(this.root, rel);
  }

  stat(rel: string): Promise<Stats | null> {
    let p = this.stats.get(rel);
    if (!p) {
      p = this.statUncached(rel);
      this.stats.set(rel, p);
    }
    return p;
  }

  seed(rel: string, st: Stats): void {
    this.stats.set(rel, Promise.resolve(st));
  }

  private async statUncached(rel: string): Promise<Stats | null> {
    if (rel === "") {
      const st = await fs.lstat(this.root);
      if (!st.isDirectory()) throw new Error(`the tree ${this.root} is not a directory`);
      return st;
    }
    if (badName(baseName(rel))) return null;
    const parent = await this.stat(parentOf(rel));
    if (!parent?.isDirectory()) return null;
    return (await orAbsent(fs.lstat(this.abs(rel)))) ?? null;
  }

  async isDir(rel: string): Promise<boolean> {
    return (await this.stat(rel))?.isDirectory() ?? false;
  }

  /** The recordable entries of a real directory, each lstat-ed. */
  async list(rel: string): Promise<MetadataEntry[]> {
    const names: string[] = [];
    for (const raw of await fs.readdir(this.abs(rel), { encoding: "buffer" })) {
      const name = raw.toString("utf8");
      // A name that is not UTF-8 cannot be written in the format: it is not recorded.
      if (Buffer.from(name, "utf8").equals(raw) && !badName(name)) names.push(name);
    }
    const out: MetadataEntry[] = [];
    const stats = await inBatches(names, async (n) => (await orAbsent(fs.lstat(path.join(this.abs(rel), n)))) ?? null);
    stats.forEach((st, i) => {
      const name = names[i]!;
      if (!st) return;
      this.seed(joinRel(rel, name), st);
      const entry = entryOf(name, st);
      if (entry) out.push(entry);
    });
    return out;
  }

  async entry(rel: string): Promise<MetadataEntry | undefined> {
    const st = await this.stat(rel);
    return st ? entryOf(baseName(rel), st) : undefined;
  }
}

/** A directory that vanished between lstat and readdir has no listing; any other error is the caller's. */
export function vanished(err: unknown): null {
  if (isAbsent(err)) return null;
  throw err;
}

/** fn over items, `size` at a time, results in order. */
export async function inBatches<T, R>(items: T[], fn: (item: T) => Promise<R>, size = FS_BATCH): Promise<R[]> {
  const out: R[] = [];
  for (const batch of chunks(items, size)) out.push(...(await Promise.all(batch.map(fn))));
  return out;
}
