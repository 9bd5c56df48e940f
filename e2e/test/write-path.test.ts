import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  createVolume,
  type Driver,
  dialWorker,
  freePort,
  metricsText,
  metricValue,
  modifyVolume,
  type PublishedVolume,
  reasons,
  report,
  setVolumeClass,
  sh,
  stageAndPublish,
  startDriver,
  unpublishAndUnstage,
  waitFor,
} from "../src/driver";
import { call, type gitWorker } from "@git-csi/protos";
import { type BareRepoOps, forgeMerge, logPushes, refusePushes, runGit, startGitDaemon } from "../src/git-server";
import { startHttpGitServer } from "../src/http-server";
import { startSshGitServer } from "../src/ssh-server";

/** A real git server of one transport, and the Secret data a volume of it needs. */
type GitServer = BareRepoOps & { url(repo: string): string; stop(): Promise<void> };
interface Transport {
  name: string;
  start(): Promise<{ server: GitServer; secret: Record<string, string> }>;
}

const TRANSPORTS: Transport[] = [
  { name: "git daemon", start: async () => ({ server: await startGitDaemon(), secret: {} }) },
  {
    name: "ssh with a deploy key",
    start: async () => {
      const server = await startSshGitServer();
      const key = await server.addDeployKey("write-path");
      return { server, secret: { "ssh-privatekey": key.privateKey, known_hosts: server.hostKeyLine } };
    },
  },
  {
    name: "smart HTTP with a token",
    start: async () => {
      const server = await startHttpGitServer();
      return { server, secret: { username: server.username, password: server.token } };
    },
  },
];

/** What the remote holds at a path of a branch, or undefined. */
async function remoteFile(server: GitServer, repo: string, ref: string, file: string): Promise<string | undefined> {
  return server.git(repo, "show", `${ref}:${file}`).catch(() => undefined);
}

async function remoteHas(server: GitServer, repo: string, ref: string): Promise<boolean> {
  return (await server.git(repo, "rev-parse", "--verify", "--quiet", `refs/heads/${ref}`).catch(() => "")) !== "";
}

const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };

for (const transport of TRANSPORTS)
  describe(`what happens after a write, over ${transport.name}`, () => {
    let server: GitServer;
    let secret: Record<string, string>;
    let driver: Driver;
    let n = 0;
    /**
     * The cases of the volume's own logic, which no transport changes, run
     * over the first transport only: `make test` has an hour. Every transport
     * still runs what fetches, pushes, is refused, sends a large pack and
     * carries its credential across a worker restart.
     */
    const everything = transport === TRANSPORTS[0];
    const logicTest = everything ? test : undefined;
    const logicDescribe = everything ? describe : undefined;

    before(async () => {
      ({ server, secret } = await transport.start());
      driver = await startDriver({ metricsPort: await freePort() });
    });

    after(async () => {
      await driver?.stop();
      await server?.stop();
    });

    /** A fresh repository and a published volume of it. */
    async function volumeOn(files: Record<string, string> = { "configuration.yaml": "name: home\n" }): Promise<{ repo: string; volume: PublishedVolume }> {
      const repo = `repo-${++n}.git`;
      await server.createRepo(repo, { files });
      const created = await createVolume(driver, `vol-${n}`, server.url(repo));
      return { repo, volume: await stageAndPublish(driver, created, undefined, `pod-${n}`, { stage: secret, publish: secret }) };
    }

    /** The volume staged and published again, on the same node, by a new pod. */
    async function restage(volume: PublishedVolume): Promise<PublishedVolume> {
      await unpublishAndUnstage(driver, volume);
      return stageAndPublish(
        driver,
        { volumeId: volume.volumeId, volumeContext: volume.context, capacityBytes: 0, contentSource: undefined, accessibleTopology: [] },
        undefined,
        `re-${volume.volumeId}`,
        { stage: secret, publish: secret },
      );
    }

    test("unarmed, the volume reports what it would commit and commits nothing; a class arms it; removing the class unarms it", async () => {
      const { repo, volume } = await volumeOn();
      const first = await server.git(repo, "rev-parse", "main");
      await sh(`echo one > '${volume.targetPath}/a.txt'`);
      const unarmed = await waitFor("a.txt pending", async () => {
        const r = await report(driver, volume.volumeId);
        return r.pendingPaths.includes("a.txt") && r;
      });
      assert.equal(unarmed.armed, false);
      assert.equal(metricValue(await metricsText(driver), "git_csi_armed", volume.volumeId), 0);
      await sleep(1500);
      assert.equal(await server.git(repo, "rev-parse", "main"), first, "an unarmed volume pushes nothing");

      await modifyVolume(driver, volume.volumeId, { ...FAST, "commit.author": "Home Assistant <homeassistant@home.example>" });
      await waitFor("a.txt pushed", () => remoteFile(server, repo, "main", "a.txt"));
      assert.equal(await server.git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", "main"), "Home Assistant <homeassistant@home.example>|Home Assistant <homeassistant@home.example>");
      const armed = await waitFor("the push recorded in the report", async () => {
        const r = await report(driver, volume.volumeId);
        return r.unpushedCommits === 0 && r.lastPushUnixMs > 0 && r;
      });
      assert.equal(armed.armed, true);
      assert.deepEqual(armed.pendingPaths, []);
      assert.equal(armed.unpushedCommits, 0);
      assert.ok(reasons(armed).includes("GitVolumeArmed") && reasons(armed).includes("GitVolumePushed"), reasons(armed).join());
      const metrics = await metricsText(driver);
      assert.equal(metricValue(metrics, "git_csi_armed", volume.volumeId), 1);
      assert.ok((metricValue(metrics, "git_csi_last_push_timestamp_seconds", volume.volumeId) ?? 0) > Date.now() / 1000 - 60);

      // The Pending event: armed, and paths wait for the quiesce.
      await sh(`echo two > '${volume.targetPath}/b.txt'`);
      await waitFor("b.txt pushed", () => remoteFile(server, repo, "main", "b.txt"));
      assert.ok(reasons(await report(driver, volume.volumeId)).includes("GitVolumePending"));

      await setVolumeClass(driver, volume.volumeId, undefined);
      await sh(`echo three > '${volume.targetPath}/c.txt'`);
      await waitFor("c.txt pending", async () => (await report(driver, volume.volumeId)).pendingPaths.includes("c.txt"));
      await sleep(2000);
      assert.equal(await remoteFile(server, repo, "main", "c.txt"), undefined);
      const again = await report(driver, volume.volumeId);
      assert.equal(again.armed, false);
      assert.ok(reasons(again).includes("GitVolumeUnarmed"));
      await unpublishAndUnstage(driver, volume);
    });

    logicTest?.("a bad class parameter is refused and the volume keeps its policy", async () => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, FAST);
      await assert.rejects(setVolumeClass(driver, volume.volumeId, { "push.quiesce": "later" }), /class parameter push.quiesce: "later" is not a duration/);
      await sh(`echo kept > '${volume.targetPath}/kept.txt'`);
      await waitFor("kept.txt pushed under the old policy", () => remoteFile(server, repo, "main", "kept.txt"));
      assert.equal((await report(driver, volume.volumeId)).armed, true);
      await unpublishAndUnstage(driver, volume);
    });

    logicTest?.("files over commit.maxFileSize are skipped and named; ignore and .gitignore keep paths out", async () => {
      const { repo, volume } = await volumeOn({ ".gitignore": "*.log\n", "configuration.yaml": "x\n" });
      await setVolumeClass(driver, volume.volumeId, { ...FAST, "commit.maxFileSize": "1Ki", ignore: ".storage/,*.db*" });
      const t = volume.targetPath;
      await sh(
        `head -c 4096 /dev/zero > '${t}/big.bin' && mkdir -p '${t}/.storage' && echo s > '${t}/.storage/auth' && echo d > '${t}/home.db' && echo w > '${t}/home.db-wal' && echo l > '${t}/app.log' && echo ok > '${t}/ok.txt'`,
      );
      await waitFor("ok.txt pushed", () => remoteFile(server, repo, "main", "ok.txt"));
      const tree = (await server.git(repo, "ls-tree", "-r", "--name-only", "main")).split("\n").sort();
      assert.deepEqual(tree, [".gitignore", "configuration.yaml", "ok.txt"]);
      const r = await report(driver, volume.volumeId);
      assert.deepEqual(r.skippedPaths, ["big.bin"]);
      const skippedEvent = r.recentEvents.find((e) => e.reason === "GitVolumeFileSkipped");
      assert.equal(skippedEvent?.type, "Warning");
      assert.match(skippedEvent!.message, /big\.bin is 4096 bytes, over commit\.maxFileSize 1024/);
      const metrics = await metricsText(driver);
      assert.equal(metricValue(metrics, "git_csi_skipped_files", volume.volumeId), 1);
      assert.equal(metricValue(metrics, "git_csi_volume_abnormal", volume.volumeId), 1);
      // Shrunk under the limit, it is committed and no longer skipped.
      await sh(`head -c 100 /dev/zero > '${t}/big.bin'`);
      await waitFor("big.bin pushed", () => remoteFile(server, repo, "main", "big.bin"));
      await waitFor("no skipped files", async () => (await report(driver, volume.volumeId)).skippedPaths.length === 0);
      await unpublishAndUnstage(driver, volume);
    });

    logicTest?.("push.maxLatency pushes a tree that never goes quiet", async () => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "3s", "push.maxLatency": "4s" });
      const started = Date.now();
      const writer = sh(`for i in $(seq 1 24); do echo $i >> '${volume.targetPath}/busy.log'; sleep 0.5; done`);
      await waitFor("a push while writes go on", () => remoteFile(server, repo, "main", "busy.log"), 15_000);
      assert.ok(Date.now() - started < 11_000, "pushed before the writer stopped");
      await writer;
      await waitFor("every line pushed", async () => (await remoteFile(server, repo, "main", "busy.log"))?.split("\n").filter(Boolean).length === 24);
      await unpublishAndUnstage(driver, volume);
    });

    test("the driver pushes when the pod stops", async () => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1h", "push.maxLatency": "2h" });
      await sh(`echo stop > '${volume.targetPath}/at-stop.txt'`);
      await sleep(500);
      assert.equal(await remoteFile(server, repo, "main", "at-stop.txt"), undefined);
      await unpublishAndUnstage(driver, volume);
      assert.equal(await remoteFile(server, repo, "main", "at-stop.txt"), "stop");
    });

    // The watcher sends the first event of a burst at once and holds the rest
    // until 50 ms pass without one: a pod stopped in that time would leave its
    // last writes out of the flush's commit, and off the remote.
    test("a pod stopped right after a burst of writes: the flush pushes every one, even those the watcher has not told of yet", async (t) => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1h", "push.maxLatency": "2h" });
      const worker = dialWorker(driver);
      t.after(() => worker.close());
      await sh(`cd '${volume.targetPath}' && for i in $(seq 1 40); do echo "line $i" > burst-$i.txt; done`);
      // What the mount owner asks at an unpublish, at once: the watcher still holds the burst's last events.
      await call(worker.flushVolume.bind(worker), { volumeId: volume.volumeId }, 30_000);
      const missing: string[] = [];
      for (let i = 1; i <= 40; i++) if ((await remoteFile(server, repo, "main", `burst-${i}.txt`)) !== `line ${i}`) missing.push(`burst-${i}.txt`);
      assert.deepEqual(missing, [], "written before the flush, missing on the remote after it");
      await unpublishAndUnstage(driver, volume);
    });

    // The mount's writeback cache keeps a write in the kernel until a close or
    // an fsync; the kernel's own writeback comes 30 s later. The mount owner's
    // flusher sends it to the backing tree within a second, so the quiesce
    // runs from the write as it would on a local disk.
    logicTest?.("a write to a file the application keeps open is committed after the quiesce, before any close or fsync", async () => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, FAST);
      const file = await fs.open(path.join(volume.targetPath, "kept-open.log"), "w");
      try {
        await file.write("first line\n");
        await waitFor("the open file's write pushed", async () => (await remoteFile(server, repo, "main", "kept-open.log")) === "first line", 10_000);
        await file.write("second line\n");
        await waitFor("the second write pushed", async () => (await remoteFile(server, repo, "main", "kept-open.log")) === "first line\nsecond line", 10_000);
      } finally {
        await file.close();
      }
      await unpublishAndUnstage(driver, volume);
    });

    // The writeback cache keeps the application's write in the kernel, unseen
    // by git, until the flusher's next sync (within a second). A rebase that
    // moves the tree in that second would take upstream's file over it, and
    // the kernel would later write the pages to the replaced file. The worker
    // asks the mount owner to sync the mount before it decides and moves.
    logicTest?.("a write still in the kernel's cache when a rebase would move the tree is kept: the volume moves to its side branch", async (t) => {
      const { repo, volume } = await volumeOn({ "state.txt": "base\n" });
      await setVolumeClass(driver, volume.volumeId, FAST);
      const worker = dialWorker(driver);
      t.after(() => worker.close());
      await server.commitFiles(repo, { "state.txt": "upstream\n" });
      // Overwritten in place at its own length: nothing reaches the tree before a flush.
      const file = await fs.open(path.join(volume.targetPath, "state.txt"), "r+");
      try {
        await file.write("pod!\n", 0);
        await fs.writeFile(path.join(volume.targetPath, "trigger.txt"), "push now\n");
        // A commit, a push refused because main moved, a rebase: well within the flusher's second.
        await call(worker.flushVolume.bind(worker), { volumeId: volume.volumeId }, 30_000);
      } finally {
        await file.close();
      }
      const side = `main.${volume.volumeId}`;
      await waitFor("the application's state.txt on the side branch", async () => (await remoteFile(server, repo, side, "state.txt")) === "pod!", 20_000);
      assert.equal(await remoteFile(server, repo, "main", "state.txt"), "upstream");
      assert.equal(await fs.readFile(path.join(volume.targetPath, "state.txt"), "utf8"), "pod!\n");
      const event = (await report(driver, volume.volumeId)).recentEvents.find((e) => e.reason === "GitVolumeDiverged");
      assert.match(event?.message ?? "", /a file the application changed since the last commit was also changed upstream/);
      await unpublishAndUnstage(driver, volume);
    });

    for (const signal of ["SIGTERM", "SIGKILL"] as const) {
      test(`a write made while the git worker was down (${signal}) is committed when the quiesce passes`, async () => {
        const { repo, volume } = await volumeOn();
        await setVolumeClass(driver, volume.volumeId, FAST);
        const pid = await driver.pid("git-worker");
        process.kill(pid, signal);
        await waitFor("the worker gone", async () => {
          try {
            process.kill(pid, 0);
            return false;
          } catch {
            return true;
          }
        });
        await sh(`echo down > '${volume.targetPath}/while-down.txt'`);
        // With a Secret too: the mount owner hands the restarted worker the Secret it kept, without a publish.
        await waitFor("the write pushed after the restart", () => remoteFile(server, repo, "main", "while-down.txt"), 20_000).catch((err) => {
          console.error(
            driver
              .logs()
              .split("\n")
              .filter((l) => /git-worker|worker_restart/.test(l) && !/"operation":"(probe)"/.test(l))
              .slice(-30)
              .join("\n"),
          );
          throw err;
        });
        // SIGTERM lets the watcher keep a snapshot; after SIGKILL one full status finds the write.
        const found = signal === "SIGTERM" ? /written while nothing watched, from the watcher's snapshot/ : /no watcher snapshot: one full git status/;
        assert.match(
          driver
            .logs()
            .split("\n")
            .filter((l) => l.includes(`"volume":"${volume.volumeId}"`))
            .join("\n"),
          found,
        );
        await unpublishAndUnstage(driver, volume);
      });
    }

    logicTest?.("two volumes of one URL share one bare repository on the node", async () => {
      const repo = "shared.git";
      await server.createRepo(repo);
      const stores = async () => (await fs.readdir(path.join(driver.stateDir, "repos"))).length;
      const a = await stageAndPublish(driver, await createVolume(driver, "shared-a", server.url(repo)), undefined, "shared-a", { stage: secret, publish: secret });
      const withOne = await stores();
      const b = await stageAndPublish(driver, await createVolume(driver, "shared-b", server.url(repo)), undefined, "shared-b", { stage: secret, publish: secret });
      assert.equal(await stores(), withOne, "the second volume of the URL made no second bare repository");
      assert.match(driver.logs(), /"message":"cloned the work tree"[^\n]*"volume":"shared-b"|"volume":"shared-b"[^\n]*"message":"cloned the work tree"/);
      await unpublishAndUnstage(driver, a);
      await unpublishAndUnstage(driver, b);
    });

    test("push rejected because the ref moved: rebase beside the tree, GitVolumeRebased, the pod's tree takes upstream's files and keeps the application's", async () => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, { ...FAST, "commit.maxFileSize": "1Ki" });
      // A file the application keeps writing that is never committed: over the size limit.
      await sh(`head -c 4096 /dev/zero > '${volume.targetPath}/uncommitted.bin'`);
      await server.commitFiles(repo, { "from-upstream.txt": "upstream\n" }, { message: "a person's commit" });
      await sh(`echo mine > '${volume.targetPath}/mine.txt'`);
      await waitFor("mine.txt pushed", () => remoteFile(server, repo, "main", "mine.txt"));
      // The pod's tree takes the rebased commit once it landed.
      await waitFor("GitVolumeRebased", async () => reasons(await report(driver, volume.volumeId)).includes("GitVolumeRebased"));
      assert.equal(await remoteFile(server, repo, "main", "from-upstream.txt"), "upstream");
      assert.equal(await server.git(repo, "log", "--format=%s", "-2", "main").then((s) => s.split("\n")[1]), "a person's commit");
      assert.equal(await sh(`cat '${volume.targetPath}/from-upstream.txt'`), "upstream\n");
      assert.equal((await sh(`wc -c < '${volume.targetPath}/uncommitted.bin'`)).trim(), "4096");
      const r = await report(driver, volume.volumeId);
      assert.ok(reasons(r).includes("GitVolumeRebased"), reasons(r).join());
      assert.equal(r.sideBranch, "");
      assert.equal(await remoteHas(server, repo, `main.${volume.volumeId}`), false);
      await unpublishAndUnstage(driver, volume);
    });

    logicTest?.("a rebase a killed git worker left half done is cleared, never taken for a conflict", async () => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, FAST);
      await server.commitFiles(repo, { "first-upstream.txt": "1\n" });
      await sh(`echo a > '${volume.targetPath}/a.txt'`);
      await waitFor("a.txt pushed after a rebase", () => remoteFile(server, repo, "main", "a.txt"));
      // What a worker killed during a rebase leaves in the scratch worktree's git directory.
      const repos = path.join(driver.stateDir, "repos");
      const admins = await Promise.all((await fs.readdir(repos)).map(async (r) => path.join(repos, r, "worktrees", `${volume.volumeId}.rebase`)));
      const admin = (await Promise.all(admins.map(async (a) => ((await fs.stat(a).catch(() => undefined)) ? a : undefined)))).find(Boolean)!;
      await fs.mkdir(path.join(admin, "rebase-merge"));
      await fs.writeFile(path.join(admin, "rebase-merge", "head-name"), "detached HEAD\n");
      await server.commitFiles(repo, { "second-upstream.txt": "2\n" });
      await sh(`echo b > '${volume.targetPath}/b.txt'`);
      await waitFor("b.txt pushed after a second rebase", () => remoteFile(server, repo, "main", "b.txt"));
      const r = await report(driver, volume.volumeId);
      assert.equal(r.sideBranch, "");
      assert.equal(await remoteHas(server, repo, `main.${volume.volumeId}`), false);
      await unpublishAndUnstage(driver, volume);
    });

    logicDescribe?.("the side branch heals once the ref holds everything it changed, whatever the merge", () => {
      /**
       * A volume on its side branch: a write that conflicts with upstream,
       * then a commit there that changes the same line again, so a squash
       * replayed commit by commit would conflict with itself; a 0600 file and
       * an empty directory for refs/git-csi/metadata.
       */
      async function onSideBranch(): Promise<{ repo: string; volume: PublishedVolume; side: string }> {
        const { repo, volume } = await volumeOn({ "configuration.yaml": "name: home\n" });
        await setVolumeClass(driver, volume.volumeId, FAST);
        const side = `main.${volume.volumeId}`;
        await server.commitFiles(repo, { "configuration.yaml": "name: upstream\n" });
        await sh(`echo 'name: pod' > '${volume.targetPath}/configuration.yaml'`);
        await waitFor("the side branch", () => remoteHas(server, repo, side));
        const t = volume.targetPath;
        await sh(`echo 'name: pod, again' > '${t}/configuration.yaml' && echo more > '${t}/more.txt' && echo s > '${t}/secret.txt' && chmod 0600 '${t}/secret.txt' && mkdir '${t}/cache'`);
        await waitFor("more.txt on the side branch", () => remoteFile(server, repo, side, "more.txt"));
        assert.equal(await remoteFile(server, repo, "main", "more.txt"), undefined);
        return { repo, volume, side };
      }

      /** The volume pushes to its side branch, and says so in its report and metrics. */
      async function stillDiverged(volume: PublishedVolume, side: string): Promise<gitWorker.VolumeReport> {
        const r = await report(driver, volume.volumeId);
        assert.equal(r.sideBranch, side);
        const metrics = await metricsText(driver);
        assert.equal(metricValue(metrics, "git_csi_diverged", volume.volumeId), 1);
        assert.equal(metricValue(metrics, "git_csi_volume_abnormal", volume.volumeId), 1);
        return r;
      }

      /** The next push after the forge's merge lands on main: the volume is back there, the side branch gone, nothing lost. */
      async function healsAtNextPush(repo: string, volume: PublishedVolume, side: string): Promise<void> {
        await sh(`echo after > '${volume.targetPath}/after-merge.txt'`);
        await waitFor("after-merge.txt on main", () => remoteFile(server, repo, "main", "after-merge.txt"));
        await assertHealed(repo, volume, side);
      }

      async function assertHealed(repo: string, volume: PublishedVolume, side: string): Promise<void> {
        assert.equal(await remoteHas(server, repo, side), false, "the side branch is deleted");
        assert.equal(await remoteFile(server, repo, "main", "configuration.yaml"), "name: pod, again");
        assert.equal(await remoteFile(server, repo, "main", "more.txt"), "more");
        assert.equal(await sh(`cat '${volume.targetPath}/configuration.yaml'`), "name: pod, again\n");
        const healed = await report(driver, volume.volumeId);
        assert.equal(healed.sideBranch, "");
        assert.ok(reasons(healed).includes("GitVolumeHealed"), reasons(healed).join());
        assert.equal(healed.pushFailures, 0, "no push failed on the way");
        const metrics = await metricsText(driver);
        assert.equal(metricValue(metrics, "git_csi_diverged", volume.volumeId), 0);
        await waitFor("the abnormal gauge cleared", async () => metricValue(await metricsText(driver), "git_csi_volume_abnormal", volume.volumeId) === 0);
        // refs/git-csi/metadata describes the healed tree under the ref's name alone: the 0600 file and the empty directory.
        assert.equal(await server.git(repo, "ls-tree", "--name-only", "refs/git-csi/metadata"), "main");
        const root = await server.git(repo, "show", "refs/git-csi/metadata:main/da/da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert.match(root, /\{"name":"secret\.txt","type":"file","mode":384,/);
        assert.match(root, /\{"name":"cache","type":"dir",/);
      }

      test("a merge commit: the next push heals it", async () => {
        const { repo, volume, side } = await onSideBranch();
        assert.equal(await remoteFile(server, repo, side, "configuration.yaml"), "name: pod, again");
        assert.equal(await remoteFile(server, repo, "main", "configuration.yaml"), "name: upstream");
        const event = (await stillDiverged(volume, side)).recentEvents.find((e) => e.reason === "GitVolumeDiverged");
        assert.ok(event && event.message.includes(side) && event.message.includes("main"), event?.message);
        await forgeMerge(server, repo, side, "merge");
        await healsAtNextPush(repo, volume, side);
        await unpublishAndUnstage(driver, volume);
      });

      for (const kind of ["squash", "rebase"] as const)
        test(`a ${kind} merge: no merge commit names the side branch, and the next push heals it`, async () => {
          const { repo, volume, side } = await onSideBranch();
          await forgeMerge(server, repo, side, kind);
          const sideTip = await server.git(repo, "rev-parse", side);
          await assert.rejects(server.git(repo, "merge-base", "--is-ancestor", sideTip, "main"), "main does not contain the side branch's commits");
          await healsAtNextPush(repo, volume, side);
          await unpublishAndUnstage(driver, volume);
        });

      test("a squash merge, then the forge deletes the side branch: the next push heals it, and no push fails", async () => {
        const { repo, volume, side } = await onSideBranch();
        await forgeMerge(server, repo, side, "squash");
        await server.git(repo, "update-ref", "-d", `refs/heads/${side}`);
        await healsAtNextPush(repo, volume, side);
        await unpublishAndUnstage(driver, volume);
      });

      test("a squash merge, and the side branch deleted, while the pod was away: the volume heals at stage", async () => {
        const { repo, volume, side } = await onSideBranch();
        await unpublishAndUnstage(driver, volume);
        await forgeMerge(server, repo, side, "squash");
        await server.git(repo, "update-ref", "-d", `refs/heads/${side}`);
        const again = await restage(volume);
        await assertHealed(repo, again, side);
        await unpublishAndUnstage(driver, again);
      });

      test("the side branch deleted on the forge without its changes in main: it is pushed again with every commit, never healed into loss", async () => {
        const { repo, volume, side } = await onSideBranch();
        await server.git(repo, "update-ref", "-d", `refs/heads/${side}`);
        await sh(`echo later > '${volume.targetPath}/later.txt'`);
        await waitFor("the side branch pushed again", () => remoteFile(server, repo, side, "later.txt"));
        assert.equal(await remoteFile(server, repo, side, "configuration.yaml"), "name: pod, again");
        assert.equal(await remoteFile(server, repo, side, "more.txt"), "more");
        assert.equal(await remoteFile(server, repo, "main", "configuration.yaml"), "name: upstream", "main takes nothing no person merged");
        assert.equal(await remoteFile(server, repo, "main", "later.txt"), undefined);
        const r = await stillDiverged(volume, side);
        assert.equal(r.pushFailures, 0);
        assert.ok(!reasons(r).includes("GitVolumeHealed"), reasons(r).join());
        const event = r.recentEvents.find((e) => e.reason === "GitVolumeRefDeleted");
        assert.ok(event?.type === "Warning" && event.message.includes(`${side} was deleted on the forge`) && event.message.includes("main does not hold"), event?.message);
        // Merged now, it heals as any side branch does.
        await forgeMerge(server, repo, side, "squash");
        await healsAtNextPush(repo, volume, side);
        await unpublishAndUnstage(driver, volume);
      });
    });

    test("a file the application changed (not yet committed) that upstream changed too moves the volume to its side branch, and the application's file is kept", async () => {
      const { repo, volume } = await volumeOn({ "data.bin": "small\n" });
      await setVolumeClass(driver, volume.volumeId, { ...FAST, "commit.maxFileSize": "1Ki" });
      // Over the size limit, the application's data.bin stays uncommitted in the tree.
      await sh(`head -c 4096 /dev/zero > '${volume.targetPath}/data.bin'`);
      await server.commitFiles(repo, { "data.bin": "upstream\n" });
      await sh(`echo other > '${volume.targetPath}/other.txt'`);
      const side = `main.${volume.volumeId}`;
      await waitFor("the side branch", () => remoteFile(server, repo, side, "other.txt"));
      const event = (await report(driver, volume.volumeId)).recentEvents.find((e) => e.reason === "GitVolumeDiverged");
      assert.match(event?.message ?? "", /a file the application changed since the last commit was also changed upstream/);
      assert.equal((await sh(`wc -c < '${volume.targetPath}/data.bin'`)).trim(), "4096", "the application's file is kept");
      assert.equal(await remoteFile(server, repo, "main", "data.bin"), "upstream");
      await unpublishAndUnstage(driver, volume);
    });

    test("the ref deleted upstream: GitVolumeRefDeleted, and the commits go to the side branch", async () => {
      const { repo, volume } = await volumeOn();
      await setVolumeClass(driver, volume.volumeId, FAST);
      await server.git(repo, "update-ref", "-d", "refs/heads/main");
      await sh(`echo safe > '${volume.targetPath}/safe.txt'`);
      await waitFor("safe.txt on the side branch", () => remoteFile(server, repo, `main.${volume.volumeId}`, "safe.txt"));
      assert.equal(await remoteHas(server, repo, "main"), false, "the driver does not make the deleted ref again");
      assert.ok(reasons(await report(driver, volume.volumeId)).includes("GitVolumeRefDeleted"));
      await unpublishAndUnstage(driver, volume);
    });

    test("a write of over 1 MiB sends its objects ahead to a staging ref outside the lease, and the fenced push deletes it; a small write is one push", async () => {
      const { repo, volume } = await volumeOn();
      const pushes = await logPushes(server, repo);
      await setVolumeClass(driver, volume.volumeId, FAST);
      await sh(`head -c 3145728 /dev/urandom > '${volume.targetPath}/large.bin'`);
      await waitFor("large.bin on main", () =>
        server.git(repo, "cat-file", "-e", "main:large.bin").then(
          () => true,
          () => false,
        ),
      );
      const staged = (refs: string[]) => refs.filter((ref) => ref.startsWith(`refs/git-csi/staging/${volume.volumeId}/`));
      const large = await pushes();
      const ahead = large.findIndex((refs) => refs.length > 0 && staged(refs).length === refs.length);
      assert.ok(ahead >= 0, `a push of staging refs alone came first: ${JSON.stringify(large)}`);
      const fenced = large.slice(ahead + 1).find((refs) => refs.includes("refs/heads/main"));
      assert.ok(fenced, "a fenced push moved main after it");
      assert.deepEqual(staged(fenced).sort(), staged(large[ahead]!).sort(), "the fenced push deleted the staging refs");
      assert.ok(fenced.includes(`refs/git-csi/owner/${volume.volumeId}`));
      await sh(`echo small > '${volume.targetPath}/small.txt'`);
      await waitFor("small.txt on main", () => remoteFile(server, repo, "main", "small.txt"));
      const small = (await pushes()).slice(large.length);
      assert.deepEqual(
        small.map(staged),
        small.map(() => []),
        "a small write stages nothing",
      );
      assert.equal(await server.git(repo, "for-each-ref", "refs/git-csi/staging/"), "", "no staging ref is left on the remote");
      await unpublishAndUnstage(driver, volume);
    });

    test("restore: a new volume against the same URL replays modes, owners and empty directories from refs/git-csi/metadata", async () => {
      const { repo, volume } = await volumeOn();
      const pushes = await logPushes(server, repo);
      await setVolumeClass(driver, volume.volumeId, FAST);
      const t = volume.targetPath;
      await sh(
        `mkdir -p '${t}/empty/nested' '${t}/secrets' && echo token > '${t}/secrets/api' && chmod 0600 '${t}/secrets/api' && chmod 0700 '${t}/secrets' && chown 1234:5678 '${t}/secrets/api' && echo run > '${t}/run.sh' && chmod 0755 '${t}/run.sh'`,
      );
      await waitFor(
        "the metadata ref",
        async () => (await server.git(repo, "rev-parse", "--verify", "--quiet", "refs/git-csi/metadata").catch(() => "")) !== "" && (await remoteFile(server, repo, "main", "secrets/api")),
      );
      await waitFor("the metadata of secrets/api", async () => (await server.git(repo, "log", "-1", "-p", "refs/git-csi/metadata")).includes('"name":"api"'));
      const files = (await server.git(repo, "ls-tree", "-r", "--name-only", "main")).split("\n");
      assert.deepEqual(files.sort(), ["configuration.yaml", "run.sh", "secrets/api"], "metadata never appears in the branch's files");
      // The commit and the record of its modes went in one atomic push, with the owner ref's renewal.
      const together = (await pushes()).filter((refs) => refs.includes("refs/heads/main"));
      assert.ok(together.length > 0, "a push moved main");
      for (const refs of together) assert.deepEqual(refs.sort(), [`refs/git-csi/metadata`, `refs/git-csi/owner/${volume.volumeId}`, "refs/heads/main"]);
      await unpublishAndUnstage(driver, volume);

      const restored = await stageAndPublish(driver, await createVolume(driver, `restore-${n}`, server.url(repo)), undefined, `restore-${n}`, { stage: secret, publish: secret });
      const tree = path.join(driver.stateDir, "trees", restored.volumeId);
      const stat = (p: string) => fs.lstat(path.join(tree, p));
      assert.equal((await stat("secrets/api")).mode & 0o7777, 0o600);
      assert.deepEqual([(await stat("secrets/api")).uid, (await stat("secrets/api")).gid], [1234, 5678]);
      assert.equal((await stat("secrets")).mode & 0o7777, 0o700);
      assert.equal((await stat("run.sh")).mode & 0o7777, 0o755);
      assert.ok((await stat("empty/nested")).isDirectory(), "the empty directories came back");
      assert.match(driver.logs(), /"message":"replayed modes, owners and empty directories"[^\n]*"volume":"restore-/);
      await unpublishAndUnstage(driver, restored);
    });

    logicTest?.("hostile metadata is refused with a log line and does not stop the stage", async () => {
      const repo = `hostile-${++n}.git`;
      await server.createRepo(repo, { files: { "a.txt": "a\n" } });
      const gitDir = server.repoPath(repo);
      const listing =
        [
          '{"dir":""}',
          '{"name":"..","type":"dir","mode":493,"uid":0,"gid":0}',
          '{"name":"a.txt","type":"file","mode":384,"uid":0,"gid":0}',
          '{"name":"kept","type":"dir","mode":448,"uid":0,"gid":0}',
        ].join("\n") + "\n";
      const blob = (await runGit(["--git-dir", gitDir, "hash-object", "-w", "--stdin"], { input: listing })).trim();
      const index = path.join(driver.dir, `hostile-${n}.index`);
      const env = { GIT_INDEX_FILE: index };
      await runGit(["--git-dir", gitDir, "update-index", "--add", "--cacheinfo", `100644,${blob},main/da/da39a3ee5e6b4b0d3255bfef95601890afd80709`], { env });
      const treeOid = (await runGit(["--git-dir", gitDir, "write-tree"], { env })).trim();
      const commit = (await runGit(["--git-dir", gitDir, "commit-tree", treeOid, "-m", "hostile"])).trim();
      await server.git(repo, "update-ref", "refs/git-csi/metadata", commit);

      const volume = await stageAndPublish(driver, await createVolume(driver, `hostile-${n}`, server.url(repo)), undefined, `hostile-${n}`, { stage: secret, publish: secret });
      const tree = path.join(driver.stateDir, "trees", volume.volumeId);
      assert.equal((await fs.lstat(path.join(tree, "a.txt"))).mode & 0o7777, 0o600, "the good entries still apply");
      assert.ok((await fs.lstat(path.join(tree, "kept"))).isDirectory());
      assert.match(driver.logs(), /"operation":"replay_metadata"[^\n]*\.\.|\.\.[^\n]*"operation":"replay_metadata"/);
      await unpublishAndUnstage(driver, volume);
    });

    describe("at stage, the tree is compared to the ref", () => {
      /** A write committed while the forge refuses pushes, and the pod stopped: the tree is ahead of the ref. */
      async function commitThatCannotPush(repo: string, volume: PublishedVolume, write: string): Promise<void> {
        const allowPushes = await refusePushes(server, repo);
        await sh(write);
        await waitFor("a failed push", async () => (await report(driver, volume.volumeId)).pushFailures > 0);
        await unpublishAndUnstage(driver, volume);
        await allowPushes();
      }

      logicTest?.("behind: the tree takes upstream", async () => {
        const { repo, volume } = await volumeOn();
        await setVolumeClass(driver, volume.volumeId, FAST);
        await unpublishAndUnstage(driver, volume);
        await server.commitFiles(repo, { "while-away.txt": "upstream\n" });
        const again = await restage(volume);
        assert.equal(await sh(`cat '${again.targetPath}/while-away.txt'`), "upstream\n");
        await unpublishAndUnstage(driver, again);
      });

      test("ahead: nothing changes, and the next push sends what the last unstage could not", async () => {
        const { repo, volume } = await volumeOn();
        await setVolumeClass(driver, volume.volumeId, FAST);
        const allowPushes = await refusePushes(server, repo);
        await sh(`echo late > '${volume.targetPath}/late.txt'`);
        await waitFor("a failed push", async () => (await report(driver, volume.volumeId)).pushFailures > 0);
        const failed = await report(driver, volume.volumeId);
        assert.ok(failed.recentEvents.some((e) => e.reason === "GitVolumePushFailed" && e.type === "Warning" && /read-only for this test/.test(e.message)));
        const metrics = await metricsText(driver);
        assert.ok((metricValue(metrics, "git_csi_push_failures_total", volume.volumeId) ?? 0) >= 1);
        assert.equal(metricValue(metrics, "git_csi_unpushed_commits", volume.volumeId), 1);
        assert.equal(metricValue(metrics, "git_csi_volume_abnormal", volume.volumeId), 1);
        await unpublishAndUnstage(driver, volume);
        assert.equal(await remoteFile(server, repo, "main", "late.txt"), undefined);
        await allowPushes();
        const again = await restage(volume);
        assert.equal(await sh(`cat '${again.targetPath}/late.txt'`), "late\n");
        await waitFor("late.txt pushed after the restage", () => remoteFile(server, repo, "main", "late.txt"));
        await waitFor("the abnormal gauge cleared", async () => metricValue(await metricsText(driver), "git_csi_volume_abnormal", volume.volumeId) === 0);
        await unpublishAndUnstage(driver, again);
      });

      logicTest?.("diverged: the tree's commits are rebased onto upstream", async () => {
        const { repo, volume } = await volumeOn();
        await setVolumeClass(driver, volume.volumeId, FAST);
        await commitThatCannotPush(repo, volume, `echo ours > '${volume.targetPath}/ours.txt'`);
        await server.commitFiles(repo, { "theirs.txt": "theirs\n" });
        const again = await restage(volume);
        assert.equal(await sh(`cat '${again.targetPath}/theirs.txt' '${again.targetPath}/ours.txt'`), "theirs\nours\n");
        assert.ok(reasons(await report(driver, volume.volumeId)).includes("GitVolumeRebased"));
        await waitFor("ours.txt pushed on top of theirs", () => remoteFile(server, repo, "main", "ours.txt"));
        assert.equal(await remoteFile(server, repo, "main", "theirs.txt"), "theirs");
        await unpublishAndUnstage(driver, again);
      });

      logicTest?.("diverged with a conflict: the volume moves to its side branch at stage", async () => {
        const { repo, volume } = await volumeOn({ "configuration.yaml": "name: home\n" });
        await setVolumeClass(driver, volume.volumeId, FAST);
        await commitThatCannotPush(repo, volume, `echo 'name: pod' > '${volume.targetPath}/configuration.yaml'`);
        await server.commitFiles(repo, { "configuration.yaml": "name: upstream\n" });
        const again = await restage(volume);
        assert.equal(await sh(`cat '${again.targetPath}/configuration.yaml'`), "name: pod\n");
        await waitFor("the side branch", () => remoteFile(server, repo, `main.${volume.volumeId}`, "configuration.yaml"));
        const r = await report(driver, volume.volumeId);
        assert.equal(r.sideBranch, `main.${volume.volumeId}`);
        assert.ok(reasons(r).includes("GitVolumeDiverged"));
        await unpublishAndUnstage(driver, again);
      });

      logicTest?.("uncommitted writes: the tree is left as it is whatever upstream did, GitVolumeUpstreamMoved, abnormal", async () => {
        const { repo, volume } = await volumeOn();
        await sh(`echo draft > '${volume.targetPath}/draft.txt'`);
        await unpublishAndUnstage(driver, volume);
        await server.commitFiles(repo, { "moved.txt": "upstream\n" });
        const again = await restage(volume);
        assert.equal(await sh(`cat '${again.targetPath}/draft.txt'`), "draft\n");
        await assert.rejects(sh(`cat '${again.targetPath}/moved.txt'`));
        const r = await report(driver, volume.volumeId);
        const event = r.recentEvents.find((e) => e.reason === "GitVolumeUpstreamMoved");
        assert.equal(event?.type, "Warning");
        assert.ok(
          r.abnormal.some((a) => a.includes("moved upstream while the tree held uncommitted writes")),
          r.abnormal.join(),
        );
        assert.equal(metricValue(await metricsText(driver), "git_csi_volume_abnormal", volume.volumeId), 1);
        // Armed, the next push lands on top of upstream, and the volume is well again.
        await setVolumeClass(driver, volume.volumeId, FAST);
        await waitFor("draft.txt pushed onto upstream", () => remoteFile(server, repo, "main", "draft.txt"));
        assert.equal(await remoteFile(server, repo, "main", "moved.txt"), "upstream");
        await waitFor("the abnormal gauge cleared", async () => metricValue(await metricsText(driver), "git_csi_volume_abnormal", volume.volumeId) === 0);
        await unpublishAndUnstage(driver, again);
      });
    });
  });
