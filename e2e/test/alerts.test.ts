// The chart's alert rules, as helm renders them, in a real Prometheus that
// scrapes a real driver (both listeners, labeled with the node as the
// ServiceMonitor does). The driver is driven into each alert's state for
// real: a volume on its side branch, pushes and lease renewals failing
// against a remote that is down, and reads and writes refused once the
// mount's lease ran out. Each alert goes pending, or fires when its rule has
// no `for`; the `for` durations are the chart's, and when each alert fires
// is promtool's unit test (charts/rules.test.yaml, run by charts/test.sh).
import assert from "node:assert/strict";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { helmMissing } from "../src/chart";
import { createVolume, type Driver, freePort, type PublishedVolume, setVolumeClass, stageAndPublish, startDriver, unpublishAndUnstage, waitFor } from "../src/driver";
import { type GitDaemon, startGitDaemon } from "../src/git-server";
import { type Alert, type Prometheus, prometheusMissing, renderedAlertRules, startPrometheus } from "../src/prometheus";

const NODE = "alerts-node";
const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };
/** A short lease, so a mount whose renewals fail is fenced within the test. */
const LEASE = { duration: "12s", renewInterval: "3s" };
const ALERTS = ["GitCsiVolumeAbnormal", "GitCsiPushFailing", "GitCsiVolumeOnSideBranch", "GitCsiStaleEpochRefused", "GitCsiLeaseRenewalFailing"];

const SUITE = "the chart's alert rules in a real Prometheus scraping a real driver";
const missing = prometheusMissing() ?? helmMissing();
// A missing tool fails: a skipped test has not run.
if (missing) test(SUITE, () => assert.fail(missing));
else
  describe(SUITE, () => {
    let upstream: GitDaemon;
    let downed: GitDaemon;
    let driver: Driver;
    let prometheus: Prometheus;
    let onSide: PublishedVolume;
    let onDowned: PublishedVolume;
    /** Each alert's `for` in seconds, as Prometheus loaded the rules. */
    const durations = new Map<string, number>();

    before(async () => {
      // Two remotes: the one that goes down takes only its own volume with it.
      [upstream, downed] = await Promise.all([startGitDaemon(), startGitDaemon()]);
      await upstream.createRepo("side.git", { files: { "configuration.yaml": "name: home\n" } });
      await downed.createRepo("downed.git", { files: { "configuration.yaml": "name: home\n" } });
      const [metricsPort, ownerMetricsPort] = [await freePort(), await freePort()];
      driver = await startDriver({ nodeId: NODE, metricsPort, ownerMetricsPort, lease: LEASE });
      onSide = await stageAndPublish(driver, await createVolume(driver, "alerts-side", upstream.url("side.git")), undefined, "side-pod");
      onDowned = await stageAndPublish(driver, await createVolume(driver, "alerts-downed", downed.url("downed.git")), undefined, "downed-pod");
      for (const v of [onSide, onDowned]) await setVolumeClass(driver, v.volumeId, FAST);
      const dir = path.join(driver.dir, "prometheus");
      prometheus = await startPrometheus(
        dir,
        [
          { job: "git-csi-node", address: `127.0.0.1:${metricsPort}`, labels: { node: NODE } },
          { job: "git-csi-mount-owner", address: `127.0.0.1:${ownerMetricsPort}`, labels: { node: NODE } },
        ],
        [await renderedAlertRules(dir)],
      );
    });

    after(async () => {
      await prometheus?.stop();
      await downed?.up().catch(() => undefined);
      for (const v of [onSide, onDowned]) if (v) await unpublishAndUnstage(driver, v).catch(() => undefined);
      await driver?.stop();
      await Promise.all([upstream?.stop(), downed?.stop()]);
    });

    const active = async (alertname: string, labels: Record<string, string>): Promise<Alert | undefined> =>
      (await prometheus.alerts()).find((a) => a.labels.alertname === alertname && Object.entries(labels).every(([k, v]) => a.labels[k] === v));

    /** Waits until the alert is active for the labels, pending when its rule has a `for` and firing when it has none. */
    async function expectActive(alertname: string, labels: Record<string, string>): Promise<Alert> {
      const duration = durations.get(alertname);
      assert.ok(duration !== undefined, `${alertname} is not among the rules Prometheus loaded: ${[...durations.keys()].join(", ")}`);
      const state = duration > 0 ? "pending" : "firing";
      await prometheus.until(`${alertname} ${state} for ${JSON.stringify(labels)}`, async () => (await active(alertname, labels))?.state === state, 60_000);
      return (await active(alertname, labels))!;
    }

    test("Prometheus evaluates the chart's five alerts, and none is active while every volume is well", async () => {
      await prometheus.until("both listeners scraped and every rule evaluated", async () => {
        const up = await prometheus.query("up == 1");
        const rules = await prometheus.rules();
        return up.length === 2 && rules.length === ALERTS.length && rules.every((r) => r.health === "ok" && !r.lastEvaluation.startsWith("0001"));
      });
      for (const rule of await prometheus.rules()) durations.set(rule.name, rule.duration);
      assert.deepEqual([...durations.keys()].sort(), [...ALERTS].sort());
      assert.equal(durations.get("GitCsiVolumeAbnormal"), 600, "a volume abnormal for ten minutes");
      // The volumes' series are in, at their well values.
      await prometheus.until("git_csi_armed of both claims", async () => (await prometheus.query("git_csi_armed == 1")).length === 2);
      assert.deepEqual(await prometheus.alerts(), []);
    });

    test("a conflicting write moves a volume to its side branch: GitCsiVolumeOnSideBranch and GitCsiVolumeAbnormal go pending for its claim", async () => {
      await upstream.commitFiles("side.git", { "configuration.yaml": "name: upstream\n" });
      await driver.sh(`echo 'name: pod' > '${onSide.targetPath}/configuration.yaml'`);
      const side = `main.${onSide.volumeId}`;
      await waitFor("the side branch on the remote", async () => (await upstream.git("side.git", "rev-parse", "--verify", "--quiet", `refs/heads/${side}`).catch(() => "")) !== "");
      const claim = { claim: onSide.volumeId, node: NODE };
      const alert = await expectActive("GitCsiVolumeOnSideBranch", claim);
      assert.match(alert.annotations.summary!, new RegExp(`claim [^ ]*/${onSide.volumeId} pushes to its side branch`));
      await expectActive("GitCsiVolumeAbnormal", claim);
    });

    test("a remote that is down: GitCsiPushFailing goes pending for the claim, GitCsiLeaseRenewalFailing for the node", async () => {
      await downed.down();
      await driver.sh(`echo unsent > '${onDowned.targetPath}/unsent.txt'`);
      const alert = await expectActive("GitCsiPushFailing", { claim: onDowned.volumeId, node: NODE });
      assert.match(alert.annotations.description!, new RegExp(`describe pvc ${onDowned.volumeId}`));
      const renewals = await expectActive("GitCsiLeaseRenewalFailing", { node: NODE, operation: "mount_renewal_failed" });
      assert.match(renewals.annotations.summary!, new RegExp(`node ${NODE} has not renewed`));
      assert.equal(await active("GitCsiPushFailing", { claim: onSide.volumeId }), undefined, "the other remote's claim pushes");
    });

    test("the lease ran out unrenewed: the mount refuses a write, and GitCsiStaleEpochRefused fires for the node", async () => {
      const refused = await waitFor<string>(
        "a write to the fenced mount refused",
        () =>
          driver.sh(`echo stale > '${onDowned.targetPath}/stale.txt'`).then(
            () => false,
            (err: Error) => err.message,
          ),
        60_000,
      );
      assert.match(refused, /Input\/output error/);
      const alert = await expectActive("GitCsiStaleEpochRefused", { node: NODE, operation: "stale_epoch_refused" });
      assert.match(alert.annotations.description!, new RegExp(`\\(node ${NODE}\\) answered reads or writes with EIO`));
    });
  });
