// The node plugin's /metrics listener against real Prometheus tools: promtool
// finds nothing to say about what it serves, git_csi_pending_paths counts the
// writes that wait for their quiesce, a real Prometheus scrapes it and answers
// queries on the volume's series, and `git-csi report` prints the volume's
// report from the same listener.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import {
  createVolume,
  type Driver,
  freePort,
  metricsText,
  metricValue,
  modifyVolume,
  type PublishedVolume,
  report,
  sh,
  stageAndPublish,
  startDriver,
  unpublishAndUnstage,
  waitFor,
} from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";
import { PROMTOOL, prometheusMissing, startPrometheus } from "../src/prometheus";

const CLI = path.join(__dirname, "..", "..", "..", "packages", "cli", "dist", "src", "main.js");

/** A command's exit code and output, whatever the code. */
function exec(file: string, args: string[], input?: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(file, args, { timeout: 30_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, stdout, stderr });
    });
    child.stdin!.end(input ?? "");
  });
}

function gitCsi(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return exec(process.execPath, [CLI, ...args]);
}

const missing = prometheusMissing();

const SUITE = "the metrics listener with real Prometheus tools, and git-csi report";
// A missing tool fails: a skipped test has not run.
if (missing) test(SUITE, () => assert.fail(missing));
else
  describe(SUITE, () => {
    let server: GitServer;
    let driver: Driver;
    let volume: PublishedVolume;
    let address: string;

    before(async () => {
      server = await startGitDaemon();
      await server.createRepo("metrics.git", { files: { "configuration.yaml": "name: home\n" } });
      const port = await freePort();
      address = `127.0.0.1:${port}`;
      driver = await startDriver({ metricsPort: port });
      volume = await stageAndPublish(driver, await createVolume(driver, "vol-metrics", server.url("metrics.git")), undefined, "metrics-pod");
    });

    after(async () => {
      if (volume) await unpublishAndUnstage(driver, volume).catch(() => undefined);
      await driver?.stop();
      await server?.stop();
    });

    test("git-csi report says what an unarmed volume would commit", async () => {
      await sh(`echo one > '${volume.targetPath}/a.txt'`);
      await waitFor("a.txt pending", async () => (await report(driver, volume.volumeId)).pendingPaths.includes("a.txt"));
      const out = await gitCsi("report", volume.volumeId, "--metrics-address", address);
      assert.equal(out.code, 0, out.stderr);
      assert.match(out.stdout, new RegExp(`^volume ${volume.volumeId}$`, "m"));
      assert.match(out.stdout, /^unarmed: commits nothing/m);
      assert.match(out.stdout, /^would commit \(1\):\n {2}a\.txt$/m);
    });

    test("git-csi report --json prints the listener's JSON; an armed volume says so", async () => {
      await modifyVolume(driver, volume.volumeId, { "push.quiesce": "1s", "push.maxLatency": "1m" });
      await waitFor("a.txt pushed", async () => (await server.git("metrics.git", "show", "main:a.txt").catch(() => undefined)) === "one");
      await waitFor("the push in the report", async () => (await report(driver, volume.volumeId)).lastPushUnixMs > 0);
      const json = await gitCsi("report", volume.volumeId, "--json", `--metrics-address=${address}`);
      assert.equal(json.code, 0, json.stderr);
      const parsed = JSON.parse(json.stdout) as Awaited<ReturnType<typeof report>>;
      assert.equal(parsed.volumeId, volume.volumeId);
      assert.equal(parsed.armed, true);
      assert.deepEqual(parsed.pendingPaths, []);
      const human = await gitCsi("report", "--metrics-address", address, volume.volumeId);
      assert.equal(human.code, 0, human.stderr);
      assert.match(human.stdout, /^armed by class .*: commits and pushes$/m);
      assert.match(human.stdout, /^last push: \d{4}-\d\d-\d\dT.* \(\d+ s ago\)$/m);
      assert.match(human.stdout, /^recent events:\n(?: {2}.*\n)*.*GitVolumePushed/m);
    });

    test("git_csi_pending_paths counts the writes that wait for their quiesce, and is 0 again after the push", async () => {
      await modifyVolume(driver, volume.volumeId, { "push.quiesce": "5s", "push.maxLatency": "1m" });
      const pushedBefore = (await report(driver, volume.volumeId)).lastPushUnixMs;
      await sh(`echo two > '${volume.targetPath}/b.txt' && echo three > '${volume.targetPath}/c.txt'`);
      await waitFor("git_csi_pending_paths 2 in /metrics", async () => metricValue(await metricsText(driver), "git_csi_pending_paths", volume.volumeId) === 2);
      const waiting = await report(driver, volume.volumeId);
      assert.deepEqual(waiting.pendingPaths, ["b.txt", "c.txt"]);
      assert.ok(
        waiting.waitingFor.some((w) => w.includes("of quiet before committing 2 path(s)")),
        waiting.waitingFor.join("; "),
      );
      await waitFor("the push of b.txt and c.txt", async () => (await report(driver, volume.volumeId)).lastPushUnixMs > pushedBefore);
      const text = await metricsText(driver);
      assert.equal(metricValue(text, "git_csi_pending_paths", volume.volumeId), 0, text);
      assert.equal(metricValue(text, "git_csi_unpushed_commits", volume.volumeId), 0, text);
      assert.equal(await server.git("metrics.git", "show", "main:c.txt"), "three");
    });

    test("git-csi report fails clearly for an unknown volume, a silent listener, and no volume", async () => {
      const unknown = await gitCsi("report", "no-such-volume", "--metrics-address", address);
      assert.equal(unknown.code, 1);
      assert.match(unknown.stderr, /^git-csi report: volume no-such-volume is not staged on the node whose git worker listens at 127\.0\.0\.1:\d+/);
      const silent = `127.0.0.1:${await freePort()}`;
      const noAnswer = await gitCsi("report", volume.volumeId, "--metrics-address", silent);
      assert.equal(noAnswer.code, 1);
      assert.match(noAnswer.stderr, new RegExp(`^git-csi report: no answer from the metrics listener at ${silent} \\(ECONNREFUSED\\)`));
      const none = await gitCsi("report");
      assert.equal(none.code, 2);
      assert.match(none.stderr, /name exactly one volume/);
    });

    test("promtool check metrics finds nothing to say about /metrics", async () => {
      const text = await metricsText(driver);
      assert.match(text, new RegExp(`^git_csi_armed\\{[^}]*claim="${volume.volumeId}"[^}]*\\} 1$`, "m"), text);
      const lint = await exec(PROMTOOL, ["check", "metrics"], text);
      assert.equal(`${lint.code} ${lint.stdout}${lint.stderr}`, "0 ", `promtool check metrics on:\n${text}`);
    });

    test("a real Prometheus scrapes the listener and answers for the volume's claim", async () => {
      const prometheus = await startPrometheus(path.join(driver.dir, "prometheus"), [{ job: "git-csi", address }]);
      try {
        const query = prometheus.query;
        const claim = `claim="${volume.volumeId}"`;
        await prometheus.until("Prometheus has git_csi_armed of the claim at 1", async () => (await query(`git_csi_armed{${claim}}`)).some((s) => s.value[1] === "1"), 60_000);
        const abnormal = await query(`git_csi_volume_abnormal{${claim}}`);
        assert.equal(abnormal.length, 1, JSON.stringify(abnormal));
        assert.equal(abnormal[0]!.metric.job, "git-csi");
        const up = await query(`up{job="git-csi"}`);
        assert.deepEqual(
          up.map((s) => s.value[1]),
          ["1"],
        );
        const lastPush = await query(`time() - git_csi_last_push_timestamp_seconds{${claim}}`);
        assert.ok(lastPush.length === 1 && Number(lastPush[0]!.value[1]) < 300, JSON.stringify(lastPush));
      } finally {
        await prometheus.stop();
      }
    });
  });
