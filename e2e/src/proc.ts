import { readdirSync, readFileSync, readlinkSync } from "node:fs";

/** Local addresses ("0100007F:1F90" style, from /proc/net/tcp*) that pid listens on. */
export function listeningAddrs(pid: number): string[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
    if (m) inodes.add(m[1]);
  }
  const out: string[] = [];
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    for (const line of readFileSync(table, "utf8").split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length > 9 && f[3] === "0A" && inodes.has(f[9])) out.push(f[1]);
    }
  }
  return out;
}
