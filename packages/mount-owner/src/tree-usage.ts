import type { Stats } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { orAbsent } from "@git-csi/config";

/** What a tree uses: its allocated bytes (as `du` counts them) and its inodes, each hard link once. */
export interface TreeUse {
  bytes: number;
  inodes: number;
}

/** A walk's answer is kept a hundred times as long as the walk took, within these bounds. */
const KEEP_FACTOR = 100;
const KEEP_MIN_MS = 1_000;
const KEEP_MAX_MS = 10 * 60_000;

/**
 * The use of each staged tree, from a walk of it. The kubelet asks about once
 * a minute for each pod of each volume, and a tree of 100,000 files takes a
 * second or more to walk: an answer is kept a hundred times as long as its
 * walk took, so walking takes at most a hundredth of the time, and a small
 * tree's answer follows its writes within a second or two. Callers that ask
 * during a walk share it.
 */
export class TreeUsage {
  private readonly kept = new Map<string, { until: number; use: Promise<TreeUse> }>();

  constructor(private readonly now: () => number = () => performance.now()) {}

  of(treePath: string): Promise<TreeUse> {
    const now = this.now();
    for (const [tree, entry] of this.kept) if (entry.until <= now) this.kept.delete(tree);
    const kept = this.kept.get(treePath);
    if (kept) return kept.use;
    const entry = { until: Number.POSITIVE_INFINITY, use: walkTree(treePath) };
    this.kept.set(treePath, entry);
    entry.use.then(
      () => {
        const end = this.now();
        entry.until = end + Math.min(KEEP_MAX_MS, Math.max(KEEP_MIN_MS, (end - now) * KEEP_FACTOR));
      },
      // A walk that failed is not kept: the next call walks again.
      () => this.kept.get(treePath) === entry && this.kept.delete(treePath),
    );
    return entry.use;
  }
}

/**
 * Walks the backing tree (never through the mount, which a fenced epoch
 * refuses), without following symlinks. An entry removed during the walk is
 * not counted; any other failure fails the walk.
 */
export async function walkTree(treePath: string): Promise<TreeUse> {
  const linked = new Set<number>();
  const use: TreeUse = { bytes: 0, inodes: 0 };
  const count = (stats: Stats): void => {
    use.bytes += stats.blocks * 512;
    use.inodes += 1;
  };
  const walk = async (dir: string): Promise<void> => {
    const names = (await orAbsent(fs.readdir(dir))) ?? [];
    await Promise.all(
      names.map(async (name) => {
        const file = path.join(dir, name);
        const stats = await orAbsent(fs.lstat(file));
        if (!stats) return;
        if (stats.isDirectory()) {
          count(stats);
          return walk(file);
        }
        if (stats.nlink > 1 && linked.has(stats.ino)) return;
        if (stats.nlink > 1) linked.add(stats.ino);
        count(stats);
      }),
    );
  };
  const root = await fs.lstat(treePath);
  if (!root.isDirectory()) throw new Error(`${treePath} is not a directory`);
  count(root);
  await walk(treePath);
  return use;
}
