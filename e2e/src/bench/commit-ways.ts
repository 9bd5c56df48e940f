// Section 2's ways to commit and push one changed file, each one sample: (a)
// the driver, through the volume's mount; (b), (c'), (c) and (d) git by hand in
// a plain clone. See commit.ts.
import { watch } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { createVolume, type Driver, type PublishedVolume, report, setVolumeClass, stageAndPublish } from "../driver";
import { gitEnv, type GitServer } from "../git-server";
import { FILE_BYTES, FILES_PER_DIR } from "./config";
import { checkInterrupted, exec, gitSh, log, sh, until } from "./process";

const CHANGED_BY: Record<"driver" | "byHand" | "fullScan" | "pushAlone", number> = { driver: 100, byHand: 300, fullScan: 500, pushAlone: 700 };

/** A fast-import stream: one commit of `dirs` directories of `per` files of `size` bytes, each file its own blob. */
const TREE_PY = `
import sys
dirs, per, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = sys.stdout.buffer
msg = b"a bench tree of %d files\\n" % (dirs * per)
out.write(b"commit refs/heads/main\\ncommitter git.liken.sh bench <bench@git.liken.sh> 1700000000 +0000\\ndata %d\\n%s\\n" % (len(msg), msg))
for d in range(dirs):
    parts = []
    for f in range(per):
        name = b"d%03d/f%04d" % (d, f)
        body = (name + b" " + b"x" * size)[: size - 1] + b"\\n"
        parts.append(b"M 100644 inline %s\\ndata %d\\n%s\\n" % (name, len(body), body))
    out.write(b"".join(parts))
out.write(b"done\\n")
`;

export interface Tree {
  files: number;
  directories: number;
  /** The directory every change goes to: the middle one. */
  changedDir: string;
  driverRepo: string;
  handRepo: string;
  clone: string;
  volume: PublishedVolume;
}

export interface DriverSample {
  /** Write returned → remote ref moved. */
  totalMs: number;
  minusQuiesceMs: number;
  /** Write → the Pending event: the watcher, then git status of the path. */
  pendingMs: number;
  /** Write → the commit's log line, minus the quiesce: the watcher, then staging the path and committing. */
  committedMs: number;
  /** The commit's log line → the Pushed event: the metadata record, the owner record, the push. */
  pushMs: number;
}

const git = async (...args: string[]) => (await exec("git", args, gitEnv())).stdout.trim();
const remoteHead = (server: GitServer, repo: string) => git(`--git-dir=${server.repoPath(repo)}`, "rev-parse", "--verify", "--quiet", "refs/heads/main");

/** The paths the branch's last commit changed, and checks that it sits right on `parent`. */
async function lastCommitPaths(server: GitServer, repo: string, parent: string): Promise<string[]> {
  const gitDir = `--git-dir=${server.repoPath(repo)}`;
  const actual = await git(gitDir, "rev-parse", "refs/heads/main^");
  if (actual !== parent) throw new Error(`${repo}: the new commit's parent is ${actual}, not ${parent}: more than one commit was pushed`);
  return (await git(gitDir, "diff-tree", "--no-commit-id", "--name-only", "-r", "refs/heads/main^", "refs/heads/main")).split("\n").filter((p) => p !== "");
}

function changedFile(tree: Tree, way: keyof typeof CHANGED_BY, rep: number): string {
  return `${tree.changedDir}/f${String(CHANGED_BY[way] + rep).padStart(4, "0")}`;
}

export async function setUpTree(server: GitServer, driver: Driver, dir: string, files: number, classParameters: Record<string, string>, volumes: PublishedVolume[]): Promise<Tree> {
  const directories = files / FILES_PER_DIR;
  const driverRepo = `tree-${files}.git`;
  const handRepo = `tree-${files}-by-hand.git`;
  const started = Date.now();
  await gitSh(
    'git init -q --bare --initial-branch=main "$1" && python3 -c "$2" "$3" "$4" "$5" | git --git-dir="$1" fast-import --quiet --done && git clone -q --bare "$1" "$6"',
    server.repoPath(driverRepo),
    TREE_PY,
    String(directories),
    String(FILES_PER_DIR),
    String(FILE_BYTES),
    server.repoPath(handRepo),
  );
  const count = Number((await gitSh('git --git-dir="$1" ls-tree -r --name-only refs/heads/main | wc -l', server.repoPath(driverRepo))).stdout.trim());
  if (count !== files) throw new Error(`the tree of ${driverRepo} holds ${count} files, not ${files}`);

  const clone = path.join(dir, "clones", `tree-${files}`);
  await gitSh('mkdir -p "$(dirname "$2")" && git clone -q "$1" "$2" && cd "$2" && git status --porcelain', server.url(handRepo), clone);
  log(`  tree of ${files.toLocaleString("en-US")} files: repositories and a plain clone in ${((Date.now() - started) / 1000).toFixed(1)} s`);

  const stageStarted = Date.now();
  const created = await createVolume(driver, `tree-${files}`, server.url(driverRepo));
  const volume = await stageAndPublish(driver, created, undefined, `tree-${files}`);
  volumes.push(volume);
  await setVolumeClass(driver, volume.volumeId, classParameters, "bench");
  await until("the volume armed", async () => (await report(driver, volume.volumeId)).armed);
  log(`  tree of ${files.toLocaleString("en-US")} files: the volume staged, published and armed in ${((Date.now() - stageStarted) / 1000).toFixed(1)} s`);
  return { files, directories, changedDir: `d${String(Math.floor(directories / 2)).padStart(3, "0")}`, driverRepo, handRepo, clone, volume };
}

/** The driver's account of one change, from its report and log: when it saw the path pending, committed and pushed. */
async function driverTimeline(driver: Driver, volumeId: string, since: number): Promise<{ pending: number; committed: number; pushed: number }> {
  const r = await until("the push in the volume's report", async () => {
    const rep = await report(driver, volumeId);
    return rep.pendingPaths.length === 0 && rep.unpushedCommits === 0 && rep.recentEvents.some((e) => e.reason === "GitVolumePushed" && e.timeUnixMs >= since) && rep;
  });
  const at = (reason: string) => r.recentEvents.find((e) => e.reason === reason && e.timeUnixMs >= since)?.timeUnixMs ?? Number.NaN;
  let committed = Number.NaN;
  for (const line of driver.logs().split("\n")) {
    if (!line.includes('"committed"') || !line.includes(volumeId)) continue;
    try {
      const entry = JSON.parse(line) as { message?: string; volume?: string; timestamp?: string };
      const time = Date.parse(entry.timestamp ?? "");
      if (entry.message === "committed" && entry.volume === volumeId && time >= since) {
        committed = time;
        break;
      }
    } catch {
      /* not a log line */
    }
  }
  return { pending: at("GitVolumePending"), committed, pushed: at("GitVolumePushed") };
}

/**
 * When a bare repository's loose ref is replaced by another commit: inotify
 * on its directory (receive-pack renames the ref's lock file over it), so
 * the bench spawns no process while the driver works, where a poll of
 * `git rev-parse` every 20 ms took CPU from the driver's own git on a busy
 * machine, and by hand had no such poll beside it.
 */
function refMoved(gitDir: string, ref: string, before: string, timeoutMs: number): { at: Promise<number>; close: () => void } {
  const file = path.join(gitDir, ref);
  let close = () => undefined as void;
  const at = new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${ref} of ${gitDir} did not move within ${timeoutMs} ms`)), timeoutMs);
    const watcher = watch(path.dirname(file), (_event, name) => {
      const seen = Date.now();
      if (name !== path.basename(file)) return;
      void fs.readFile(file, "utf8").then(
        (now) => now.trim() !== before && now.trim() !== "" && resolve(seen),
        () => undefined,
      );
    });
    close = () => {
      clearTimeout(timer);
      watcher.close();
    };
  });
  return { at, close: () => close() };
}

/** (a) One file appended through the volume's mount, until the remote ref moves. */
export async function driverOnce(server: GitServer, driver: Driver, tree: Tree, quiesceMs: number, rep: number, timeoutMs = 60_000): Promise<DriverSample> {
  const volumeId = tree.volume.volumeId;
  await until("the volume idle", async () => {
    const r = await report(driver, volumeId);
    return r.pendingPaths.length === 0 && r.unpushedCommits === 0;
  });
  const file = changedFile(tree, "driver", rep);
  const before = await remoteHead(server, tree.driverRepo);
  const moved = refMoved(server.repoPath(tree.driverRepo), "refs/heads/main", before, timeoutMs + quiesceMs);
  moved.at.catch(() => undefined);
  checkInterrupted();
  let wrote: number;
  let movedAt: number;
  try {
    // date(1) right after the append returned: the clock starts when the write has landed.
    const { stdout } = await sh('printf "%s\\n" "$2" >> "$1" && date +%s%N', path.join(tree.volume.targetPath, file), `driver run ${rep}`);
    wrote = Number(stdout.trim()) / 1e6;
    movedAt = await moved.at;
  } finally {
    moved.close();
  }
  const timeline = await driverTimeline(driver, volumeId, Math.floor(wrote));
  const paths = await lastCommitPaths(server, tree.driverRepo, before);
  if (paths.join() !== file) throw new Error(`the driver's commit changed ${paths.join(", ")}, not ${file}`);
  const totalMs = movedAt - wrote;
  return {
    totalMs,
    minusQuiesceMs: totalMs - quiesceMs,
    pendingMs: timeline.pending - wrote,
    committedMs: timeline.committed - wrote - quiesceMs,
    pushMs: timeline.pushed - timeline.committed,
  };
}

/** Milliseconds a shell script takes, its git isolated; returns its output too. */
async function timed(script: string, ...args: string[]): Promise<{ ms: number; stdout: string }> {
  checkInterrupted();
  const t = performance.now();
  const { stdout } = await gitSh(script, ...args);
  return { ms: performance.now() - t, stdout };
}

/** (b), (c'), (c) and (d), in that order, in the plain clone. */
export async function byHandOnce(server: GitServer, tree: Tree, rep: number): Promise<{ byHand: number; status: number; fullScan: number; pushAlone: number }> {
  const handFile = changedFile(tree, "byHand", rep);
  let before = await remoteHead(server, tree.handRepo);
  const byHand = await timed('cd "$1" && printf "%s\\n" "$3" >> "$2" && git add -- "$2" && git commit -q -m "$3" && git push -q', tree.clone, handFile, `by hand, run ${rep}`);
  const handPaths = await lastCommitPaths(server, tree.handRepo, before);
  if (handPaths.join() !== handFile) throw new Error(`the by-hand commit changed ${handPaths.join(", ")}, not ${handFile}`);

  // c' times the status of the tree c then commits: one appended file.
  const scanFile = changedFile(tree, "fullScan", rep);
  await sh('printf "%s\\n" "$3" >> "$1/$2"', tree.clone, scanFile, `full scan, run ${rep}`);
  const status = await timed('cd "$1" && git status --porcelain', tree.clone);
  if (status.stdout.trim() !== `M ${scanFile}`) throw new Error(`git status --porcelain printed ${JSON.stringify(status.stdout)}, expected one modified ${scanFile}`);
  before = await remoteHead(server, tree.handRepo);
  const fullScan = await timed('cd "$1" && git add --all && git commit -q -m "$2" && git push -q', tree.clone, `full scan, run ${rep}`);
  const scanPaths = await lastCommitPaths(server, tree.handRepo, before);
  if (scanPaths.join() !== scanFile) throw new Error(`the full-scan commit changed ${scanPaths.join(", ")}, not ${scanFile}`);

  const pushFile = changedFile(tree, "pushAlone", rep);
  await gitSh('cd "$1" && printf "%s\\n" "$3" >> "$2" && git add -- "$2" && git commit -q -m "$3"', tree.clone, pushFile, `push alone, run ${rep}`);
  before = await remoteHead(server, tree.handRepo);
  const pushAlone = await timed('cd "$1" && git push -q', tree.clone);
  const pushPaths = await lastCommitPaths(server, tree.handRepo, before);
  if (pushPaths.join() !== pushFile) throw new Error(`the pushed commit changed ${pushPaths.join(", ")}, not ${pushFile}`);
  return { byHand: byHand.ms, status: status.ms, fullScan: fullScan.ms, pushAlone: pushAlone.ms };
}
