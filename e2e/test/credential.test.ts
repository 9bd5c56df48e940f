import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { status } from "@grpc/grpc-js";
import { call, CsiError } from "@git-csi/protos";
import {
  createVolume,
  type Driver,
  freePort,
  metricsText,
  metricValue,
  publish,
  reasons,
  report,
  setVolumeClass,
  sh,
  stageAndPublish,
  startDriver,
  unpublishAndUnstage,
  volumeLogs,
  waitFor,
} from "../src/driver";
import { runGit } from "../src/git-server";
import { type HttpGitServer, startHttpGitServer } from "../src/http-server";
import { type SshGitServer, startSshGitServer } from "../src/ssh-server";

const QUIET = { "push.quiesce": "1s", "push.maxLatency": "1h" };
const LEASE = { duration: "12s", renewInterval: "3s" };

/**
 * The first half of a whole driver's restart, as an upgrade of every image
 * does: the mount owner keeps the FUSE connection but forgets the Secret, so
 * it has none to give a git worker that restarts after it.
 */
async function restartMountOwner(driver: Driver): Promise<void> {
  const served = () =>
    driver
      .logs()
      .split("\n")
      .filter((l) => l.includes("the FUSE connection serves again")).length;
  const before = served();
  process.kill(await driver.pid("mount-owner"), "SIGKILL");
  await waitFor("the restarted mount owner serving the kept connection", async () => served() > before, 30_000);
}

describe("the credential", () => {
  let ssh: SshGitServer;
  let http: HttpGitServer;
  let driver: Driver;
  const keys: Record<string, string> = {};
  /** Every secret this suite handed the driver, for the scan at the end. */
  const material: string[] = [];
  let n = 0;

  const sshSecret = (key: string, knownHosts = true) => ({ "ssh-privatekey": keys[key]!, ...(knownHosts ? { known_hosts: ssh.hostKeyLine } : {}) });
  const remoteFile = (server: { git(repo: string, ...a: string[]): Promise<string> }, repo: string, file: string) => server.git(repo, "show", `main:${file}`).catch(() => undefined);

  before(async () => {
    [ssh, http] = await Promise.all([startSshGitServer(), startHttpGitServer()]);
    for (const name of ["first", "second"]) {
      keys[name] = (await ssh.addDeployKey(name)).privateKey;
      // A key's body lines: what a leak would contain.
      // The body lines of the key, less the first: openssh-key-v1's header, the same in every ed25519 key.
      material.push(
        ...keys[name]!.split("\n")
          .filter((l) => l.length > 40 && !l.startsWith("-----"))
          .slice(1),
      );
    }
    material.push(http.token);
    // A short lease: one test waits for a lease that a restarted worker could not release to run out.
    driver = await startDriver({ metricsPort: await freePort(), ownerMetricsPort: await freePort(), lease: LEASE });
  });

  after(async () => {
    await driver?.stop();
    await Promise.all([ssh?.stop(), http?.stop()]);
  });

  async function sshVolume(stageSecret: Record<string, string>, publishSecret: Record<string, string> = stageSecret) {
    const repo = `cred-${++n}.git`;
    await ssh.createRepo(repo, { files: { "configuration.yaml": "a: 1\n" } });
    const created = await createVolume(driver, `cred-${n}`, ssh.url(repo));
    return { repo, created, volume: await stageAndPublish(driver, created, undefined, `cred-${n}`, { stage: stageSecret, publish: publishSecret }) };
  }

  test("the stage fetches with the stage Secret; pushes go over ssh with the server's key checked", async () => {
    const { repo, volume } = await sshVolume(sshSecret("first"));
    assert.equal(await sh(`cat '${volume.targetPath}/configuration.yaml'`), "a: 1\n");
    await setVolumeClass(driver, volume.volumeId, QUIET);
    await sh(`echo over-ssh > '${volume.targetPath}/ssh.txt'`);
    await waitFor("ssh.txt pushed", () => remoteFile(ssh, repo, "ssh.txt"));
    assert.ok(!reasons(await report(driver, volume.volumeId)).includes("GitVolumeHostKeyUnverified"));
    await unpublishAndUnstage(driver, volume);
  });

  test("a wrong known_hosts fails the stage: strict host key checking", async () => {
    const repo = `cred-${++n}.git`;
    await ssh.createRepo(repo);
    const created = await createVolume(driver, `cred-${n}`, ssh.url(repo));
    const otherKey = ssh.hostKeyLine.replace(/ssh-ed25519 \S+/, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnGqdJ4nsY7Pq3V1dP1PXuN3R2F9b7yWm6S4JhG5B1c");
    await assert.rejects(
      stageAndPublish(driver, created, undefined, `cred-${n}`, { stage: { "ssh-privatekey": keys.first!, known_hosts: otherKey } }),
      /Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED/,
    );
  });

  test("without known_hosts the first host key is trusted, with a Warning event", async () => {
    const { volume } = await sshVolume(sshSecret("first", false));
    const event = (await report(driver, volume.volumeId)).recentEvents.find((e) => e.reason === "GitVolumeHostKeyUnverified");
    assert.equal(event?.type, "Warning");
    assert.match(event!.message, /add known_hosts to the Secret/);
    await unpublishAndUnstage(driver, volume);
  });

  test("an unknown Secret shape is an error that names the keys found and those expected, never a value", async () => {
    const repo = `cred-${++n}.git`;
    await ssh.createRepo(repo);
    const created = await createVolume(driver, `cred-${n}`, ssh.url(repo));
    await assert.rejects(stageAndPublish(driver, created, undefined, `cred-${n}`, { stage: { apikey: "s3cr3t-value", user: "me" } }), (err: unknown) => {
      assert.ok(err instanceof CsiError);
      assert.equal(err.code, status.INVALID_ARGUMENT);
      assert.match(err.message, /the volume's Secret has the keys apikey, user; a git credential needs ssh-privatekey \(with optional known_hosts\), username and password, or token/);
      assert.ok(!err.message.includes("s3cr3t-value"));
      return true;
    });
  });

  test("a publish whose Secret differs from the stage's is refused, and so is the kubelet's retry: GitVolumeRefused, FailedPrecondition, nothing mounted", async () => {
    const repo = `cred-${++n}.git`;
    await ssh.createRepo(repo);
    const created = await createVolume(driver, `cred-${n}`, ssh.url(repo));
    await assert.rejects(stageAndPublish(driver, created, undefined, `cred-${n}`, { stage: sshSecret("first"), publish: sshSecret("second") }), (err: unknown) => {
      assert.ok(err instanceof CsiError && err.code === status.FAILED_PRECONDITION, String(err));
      assert.match(err.message, /the publish Secret differs from the stage Secret/);
      return true;
    });
    // The kubelet retries the publish: refused again, never taken for a rotated Secret.
    const staged = {
      volumeId: created.volumeId,
      context: created.volumeContext,
      stagingPath: path.join(driver.dir, "staging", created.volumeId),
      targetPath: path.join(driver.dir, "pods", `cred-${n}`, "volume"),
    };
    await assert.rejects(publish(driver, staged, sshSecret("second")), /the publish Secret differs from the stage Secret/);
    const r = await report(driver, created.volumeId);
    assert.equal(r.recentEvents.filter((e) => e.reason === "GitVolumeRefused" && e.type === "Warning").length, 2);
    await assert.rejects(fs.stat(staged.targetPath));
    await call(driver.node.nodeUnstageVolume.bind(driver.node), { volumeId: created.volumeId, stagingTargetPath: path.join(driver.dir, "staging", created.volumeId) }, 60_000);
  });

  test("a revoked key: GitVolumePushFailed, counted, abnormal; the rotated Secret's next publish pushes at once", async () => {
    const { repo, volume } = await sshVolume(sshSecret("first"));
    await setVolumeClass(driver, volume.volumeId, QUIET);
    await ssh.revokeDeployKey("first");
    await sh(`echo after-revoke > '${volume.targetPath}/rotated.txt'`);
    const failed = await waitFor("a failed push", async () => {
      const r = await report(driver, volume.volumeId);
      return r.pushFailures > 0 && r;
    }).catch((err: Error) => {
      throw new Error(`${err.message}\n${volumeLogs(driver, volume.volumeId)}`);
    });
    assert.ok(failed.recentEvents.some((e) => e.reason === "GitVolumePushFailed" && e.type === "Warning"));
    const metrics = await metricsText(driver);
    assert.equal(metricValue(metrics, "git_csi_push_failures_total", volume.volumeId), 1);
    assert.equal(metricValue(metrics, "git_csi_volume_abnormal", volume.volumeId), 1);
    // The kubelet's republish brings the rotated Secret; the push does not wait for the retry.
    const republished = Date.now();
    await publish(driver, volume, sshSecret("second"));
    await waitFor("rotated.txt pushed with the new key", () => remoteFile(ssh, repo, "rotated.txt"), 4000);
    assert.ok(Date.now() - republished < 4000);
    await waitFor("the abnormal gauge cleared", async () => metricValue(await metricsText(driver), "git_csi_volume_abnormal", volume.volumeId) === 0);
    await unpublishAndUnstage(driver, volume);
  });

  test("https with a token; a rotated token arrives with the next publish and pushes at once", async () => {
    const repo = `cred-${++n}.git`;
    await http.createRepo(repo);
    const created = await createVolume(driver, `cred-${n}`, http.url(repo));
    const tokenSecret = () => ({ token: http.token });
    const volume = await stageAndPublish(driver, created, undefined, `cred-${n}`, { stage: tokenSecret(), publish: tokenSecret() });
    await setVolumeClass(driver, volume.volumeId, QUIET);
    await sh(`echo one > '${volume.targetPath}/one.txt'`);
    await waitFor("one.txt pushed over https", () => remoteFile(http, repo, "one.txt"));
    material.push(http.rotateToken());
    await sh(`echo two > '${volume.targetPath}/two.txt'`);
    await waitFor("a failed push with the old token", async () => (await report(driver, volume.volumeId)).pushFailures > 0);
    await publish(driver, volume, tokenSecret());
    await waitFor("two.txt pushed with the new token", () => remoteFile(http, repo, "two.txt"), 4000);
    await unpublishAndUnstage(driver, volume);
  });

  test("no publish Secret: GitVolumeNoPublishSecret; after a restart the unstage cannot push, posts GitVolumePushFailed, and the commit waits in the node's tree for the next stage", async () => {
    const { repo, created, volume } = await sshVolume(sshSecret("second"), {});
    assert.equal((await report(driver, volume.volumeId)).recentEvents.find((e) => e.reason === "GitVolumeNoPublishSecret")?.type, "Warning");
    await setVolumeClass(driver, volume.volumeId, { "push.quiesce": "1h", "push.maxLatency": "2h" });
    await sh(`echo waiting > '${volume.targetPath}/waiting.txt'`);
    const agents = async () => (await sh(`pgrep -f 'ssh-agent -D -a ${driver.stateDir}/sockets/agent-' || true`)).split("\n").filter(Boolean);
    const before = await agents();
    assert.ok(before.length > 0, "the volume's key is in an ssh-agent");
    await restartMountOwner(driver);
    process.kill(await driver.pid("git-worker"), "SIGKILL");
    await waitFor("the volume to wait for its credential", async () => (await report(driver, volume.volumeId)).abnormal.some((a) => a.startsWith("waits for its credential")));
    // The killed worker could not end its agents; the new one does, so no key outlives its worker.
    await waitFor("the orphaned agents ended", async () => (await agents()).every((p) => !before.includes(p)));
    assert.match(driver.logs(), /ended \d+ ssh-agent\(s\) a previous git worker left holding keys/);
    await unpublishAndUnstage(driver, volume);
    assert.match(driver.logs(), new RegExp(`"reason":"GitVolumePushFailed"[^\\n]*"volume":"${volume.volumeId}"|"volume":"${volume.volumeId}"[^\\n]*"reason":"GitVolumePushFailed"`));
    assert.equal(await remoteFile(ssh, repo, "waiting.txt"), undefined);
    const nodeRepo = (await fs.readdir(path.join(driver.stateDir, "repos"))).map((r) => path.join(driver.stateDir, "repos", r));
    const held = await Promise.all(nodeRepo.map((g) => runGit(["--git-dir", g, "show", `volume/${volume.volumeId}:waiting.txt`]).catch(() => "")));
    assert.ok(held.includes("waiting"), "the commit stays in the node's tree");
    // The restarted worker held no credential to release the mount epoch: local cleanup completed, and the lease runs out by itself.
    assert.match(volumeLogs(driver, volume.volumeId), /"operation":"mount_release_deferred"/);
    assert.match(await (await fetch(`${driver.ownerMetricsUrl}/metrics`)).text(), /^git_csi_operations_total\{operation="mount_release_deferred"\} 1$/m);
    // Step 3 and 4 of the recovery: a new PersistentVolume with both references, staged on the same node,
    // once the old epoch's lease ran out: until then it still excludes every other mount session.
    const secrets = { stage: sshSecret("second"), publish: sshSecret("second") };
    await assert.rejects(stageAndPublish(driver, created, undefined, `cred-again-${n}`, secrets), /is held by node e2e-node/);
    const again = await waitFor("the old epoch's lease to run out", () => stageAndPublish(driver, created, undefined, `cred-again-${n}`, secrets).catch(() => undefined), 30_000);
    assert.equal(await sh(`cat '${again.targetPath}/waiting.txt'`), "waiting\n", "the stage starts from the tree the node kept");
    // The class's next push (here: when the pod stops) sends what the last unstage could not.
    await unpublishAndUnstage(driver, again);
    assert.equal(await remoteFile(ssh, repo, "waiting.txt"), "waiting");
  });

  test("a driver restarted without the Secret: the next publish's Secret claims the lease, and the mount serves on from that claim", async () => {
    // Renewals every half lease: the renewal after the restart fails for want of the Secret, and the
    // next comes after the mount's serving window; only the claim the publish makes keeps it serving.
    const lease = { durationMs: 20_000, renewMs: 10_000 };
    const node = await startDriver({ lease: { duration: `${lease.durationMs / 1000}s`, renewInterval: `${lease.renewMs / 1000}s` } });
    try {
      const repo = `cred-${++n}.git`;
      await ssh.createRepo(repo, { files: { "configuration.yaml": "a: 1\n" } });
      const created = await createVolume(node, `cred-${n}`, ssh.url(repo));
      const secret = sshSecret("second");
      // Unarmed until after the restart: no push renews the owner ref, so a new record is the mount owner's renewal.
      const volume = await stageAndPublish(node, created, undefined, `cred-${n}`, { stage: secret, publish: secret });
      // A mount owner restarted since the stage holds no Secret to give the git worker that restarts below.
      await restartMountOwner(node);
      const ownerRecord = () => ssh.git(repo, "rev-parse", `refs/git-csi/owner/${volume.volumeId}`);
      const first = await ownerRecord();
      await waitFor("a renewal", async () => (await ownerRecord()) !== first, lease.durationMs);
      const renewedAt = Date.now();
      // The renewal's answer reaches the mount owner before the worker dies: a lost answer leaves the mount on the window before.
      await sleep(1000);
      process.kill(await node.pid("git-worker"), "SIGKILL");
      const until = (ms: number) => sleep(Math.max(0, renewedAt + ms - Date.now()));
      // The renewal after the restart, without the Secret; the next is due after the serving window.
      await until(lease.renewMs + 1000);
      // The kubelet's republish brings the Secret while the mount still serves.
      await publish(node, volume, secret);
      await until(lease.durationMs);
      assert.equal(await sh(`cat '${volume.targetPath}/configuration.yaml'`), "a: 1\n", "the mount serves past the window the last renewal gave it");
      await setVolumeClass(node, volume.volumeId, QUIET);
      await sh(`echo served > '${volume.targetPath}/served.txt'`);
      await waitFor("served.txt pushed", () => remoteFile(ssh, repo, "served.txt"));
      assert.doesNotMatch(volumeLogs(node, volume.volumeId), /"operation":"epoch_lost"/);
      await unpublishAndUnstage(node, volume);
    } finally {
      await node.stop();
    }
  });

  test("no key material on the node's disk, in a log, or in any process's environment", async () => {
    assert.ok(material.length >= 4);
    const hits: string[] = [];
    const scan = (where: string, text: string) => {
      for (const m of material) if (text.includes(m)) hits.push(where);
    };
    async function walk(dir: string): Promise<void> {
      for (const entry of await fs.readdir(dir, { withFileTypes: true }).catch(() => [])) {
        const p = path.join(dir, entry.name);
        if (entry.isDirectory()) await walk(p);
        else if (entry.isFile()) {
          const stat = await fs.stat(p).catch(() => undefined);
          if (stat && stat.size < 64 * 1024 * 1024) scan(p, await fs.readFile(p, "latin1").catch(() => ""));
        }
      }
    }
    // The driver's state and every file any process left in /tmp, but the forges': a forge holds its own keys and tokens.
    const forges = [ssh.baseDir, http.baseDir].map((d) => path.dirname(d));
    async function walkTmp(): Promise<void> {
      for (const entry of await fs.readdir("/tmp", { withFileTypes: true })) {
        const p = path.join("/tmp", entry.name);
        if (forges.includes(p)) continue;
        if (entry.isDirectory()) await walk(p);
        else if (entry.isFile()) scan(p, await fs.readFile(p, "latin1").catch(() => ""));
      }
    }
    await walkTmp();
    await walk(driver.stateDir);
    scan("the services' logs", driver.logs());
    for (const pid of await fs.readdir("/proc")) {
      if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
      scan(`/proc/${pid}/environ`, await fs.readFile(`/proc/${pid}/environ`, "latin1").catch(() => ""));
      scan(`/proc/${pid}/cmdline`, await fs.readFile(`/proc/${pid}/cmdline`, "latin1").catch(() => ""));
    }
    assert.deepEqual(hits, []);
  });
});
