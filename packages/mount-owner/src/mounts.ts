import { execFile } from "node:child_process";
import * as fs from "node:fs/promises";
import { promisify } from "node:util";

const run = promisify(execFile);

export interface MountEntry {
  mountPoint: string;
  fsType: string;
  source: string;
}

/** The source the kernel shows for a volume's FUSE mount and every bind of it into a pod. */
export function fuseSource(volumeId: string): string {
  return `git-csi:${volumeId}`;
}

/** `\040`-style escapes of /proc/self/mountinfo. */
function unescapeMountField(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

/** The kernel's mount table, read fresh: it is the truth after any restart. */
export async function readMountTable(): Promise<MountEntry[]> {
  const text = await fs.readFile("/proc/self/mountinfo", "utf8");
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => {
      const fields = line.split(" ");
      const separator = fields.indexOf("-");
      return { mountPoint: unescapeMountField(fields[4]!), fsType: fields[separator + 1]!, source: unescapeMountField(fields[separator + 2]!) };
    });
}

export async function isMountPoint(dir: string): Promise<boolean> {
  return (await readMountTable()).some((m) => m.mountPoint === dir);
}

export async function bindMount(source: string, target: string, readonly: boolean): Promise<void> {
  await run("mount", ["--bind", source, target]);
  if (readonly) await run("mount", ["-o", "remount,bind,ro", target]);
}

/** The mount at dir refuses every write with EROFS in the kernel: no write ever reaches its server. */
export async function remountReadOnly(dir: string): Promise<void> {
  await run("mount", ["-o", "remount,bind,ro", dir]);
}

/**
 * Unmounts every mount stacked at dir. A dead FUSE connection (ENOTCONN)
 * cannot always be unmounted in place, so a failed unmount is retried lazily.
 */
export async function unmountAll(dir: string): Promise<void> {
  while (await isMountPoint(dir)) {
    await run("umount", [dir]).catch(() => run("umount", ["-l", dir]));
  }
}
