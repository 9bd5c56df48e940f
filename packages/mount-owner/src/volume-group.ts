// The pod's fsGroup on a volume, applied as the kubelet applies it to a local
// volume with fsGroupChangePolicy OnRootMismatch: every entry's group becomes
// the fsGroup with group read and write, directories also group search and
// setgid (so what is created later inherits the group), symlinks only their
// group; nothing changes when the root already matches. Unlike the kubelet, an
// entry already in the group keeps its mode: it was given the group before (or
// created in a setgid directory), and an application's chmod since is its own
// choice. It runs on the backing tree, so the metadata ref records the result
// and a restore replays it, modes included.
import type { Stats } from "node:fs";
import * as fs from "node:fs/promises";
import { join } from "node:path";

const GROUP_RW = 0o060;
const GROUP_X = 0o010;
const MODE_BITS = 0o7777;
const S_ISGID = 0o2000;

/** What the kubelet's rootDir check asks of the root: the group, g+rwx and setgid. */
export function rootMatches(root: Stats, group: number): boolean {
  const wanted = GROUP_RW | GROUP_X | S_ISGID;
  return root.isDirectory() && root.gid === group && (root.mode & wanted) === wanted;
}

/** The mode an entry gets: directories also searchable by the group and setgid. */
function groupMode(stats: Stats): number {
  const extra = stats.isDirectory() ? GROUP_RW | GROUP_X | S_ISGID : GROUP_RW;
  return (stats.mode & MODE_BITS) | extra;
}

async function regroup(path: string, stats: Stats, group: number): Promise<void> {
  if (stats.gid !== group) await fs.lchown(path, stats.uid, group);
  // A chown clears setuid and setgid; the mode is set after it. A symlink has no mode of its own.
  if (!stats.isSymbolicLink()) await fs.chmod(path, groupMode(stats));
}

/** Walks the tree (never into a `.git` or through a symlink); resolves to whether anything changed. */
export async function applyVolumeMountGroup(treePath: string, group: number): Promise<boolean> {
  const root = await fs.lstat(treePath);
  if (rootMatches(root, group)) return false;
  const walk = async (dir: string): Promise<void> => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      if (entry.name === ".git") continue;
      const path = join(dir, entry.name);
      const stats = await fs.lstat(path);
      if (stats.gid !== group) await regroup(path, stats, group);
      if (stats.isDirectory()) await walk(path);
    }
  };
  await walk(treePath);
  // The root last: a stage interrupted half-way finds it unmatched and walks again.
  await regroup(treePath, root, group);
  return true;
}
