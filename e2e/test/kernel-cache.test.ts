// The kernel caches the mount's entries and attributes for as long as the
// lease serves (docs/fuse.md, "Caches"). Nothing cached may outlive the
// fence, nor hide a tree the git worker moved behind the mount: a reader
// that had a file cached sees EIO as soon as a renewal finds a successor,
// and upstream's file as soon as the rebase is reported.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { describe, test } from "node:test";
import { createVolume, type Driver, reasons, report, setVolumeClass, sh, stageAndPublish, unpublishAndUnstage, volumeLogs, waitFor } from "../src/driver";
import { withDaemonAndDriver } from "../src/fixtures";
import type { GitServer } from "../src/git-server";
import { takeOver } from "../src/owner-record";

/** A lease whose serving time (27 s) is far longer than a renewal interval: a cached answer would outlive the loss by seconds. */
const LEASE = { duration: "30s", renewInterval: "2s" };
const RENEW_MS = 2000;
const FAST = { "push.quiesce": "1s", "push.maxLatency": "1m" };

/**
 * An application with many files in the kernel's cache: each stat-ed, the
 * first ones open with a page read. It probes the server with fsync, with
 * no pause, so the first EIO comes while the fence's pass runs; then at once
 * it tries every cached descriptor and attribute.
 */
const CACHED_APP = String.raw`
import errno, json, os, sys, time
root, count, held = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = ["f%05d.txt" % i for i in range(count)]
fds = []
for n in names[:held]:
    fds.append(os.open(os.path.join(root, n), os.O_RDONLY))
    os.pread(fds[-1], 100, 0)
for n in names:
    os.stat(os.path.join(root, n))
probe = os.open(os.path.join(root, "a.txt"), os.O_RDONLY)
print("ready", flush=True)
deadline = time.time() + 60
while True:
    try:
        os.fsync(probe)
    except OSError as e:
        first = errno.errorcode.get(e.errno, str(e.errno))
        break
    if time.time() > deadline:
        print(json.dumps({"timeout": True}), flush=True)
        sys.exit(0)
def served(attempt, items):
    out = []
    for name, item in items:
        try:
            attempt(item)
            out.append(name)
        except OSError:
            pass
    return out
reads = served(lambda fd: os.pread(fd, 100, 0), zip(names, fds))
stats = served(lambda n: os.stat(os.path.join(root, n)), [(n, n) for n in names])
print(json.dumps({"first": first, "reads": reads, "stats": stats}), flush=True)
`;

interface CachedOutcome {
  timeout?: boolean;
  first: string;
  reads: string[];
  stats: string[];
}

/** Starts the application; resolves once its caches are filled, with what it saw after its first EIO. */
async function startCachedApp(target: string, count: number, held: number): Promise<{ outcome: Promise<CachedOutcome> }> {
  const app = spawn("python3", ["-c", CACHED_APP, target, String(count), String(held)], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  app.stdout.on("data", (c: Buffer) => (out += c.toString()));
  app.stderr.on("data", (c: Buffer) => (err += c.toString()));
  const exited = new Promise<CachedOutcome>((resolve, reject) =>
    app.once("exit", (code) => {
      const last = out.trim().split("\n").pop() ?? "";
      if (code === 0 && last.startsWith("{")) resolve(JSON.parse(last) as CachedOutcome);
      else reject(new Error(`the application exited (${code}): ${out} ${err}`));
    }),
  );
  await Promise.race([waitFor("the application's caches filled", async () => out.startsWith("ready"), 60_000), exited]);
  return { outcome: exited };
}

/** Whether a shell command on the mount fails with EIO. */
async function eio(script: string): Promise<boolean> {
  return sh(script).then(
    () => false,
    (err: Error) => /Input\/output error/.test(err.message),
  );
}

describe("the kernel's cache of the mount", { timeout: 120_000 }, () => {
  let server: GitServer;
  let driver: Driver;
  withDaemonAndDriver((s, d) => ([server, driver] = [s, d]), { lease: LEASE });

  async function volumeOn(repo: string, name: string): Promise<{ volumeId: string; target: string; tree: string; published: Awaited<ReturnType<typeof stageAndPublish>> }> {
    await server.createRepo(repo, { files: { "a.txt": "A\n" } });
    const volume = await createVolume(driver, name, server.url(repo));
    const published = await stageAndPublish(driver, volume, undefined, name);
    await setVolumeClass(driver, volume.volumeId, FAST);
    return { volumeId: volume.volumeId, target: published.targetPath, tree: path.join(driver.stateDir, "trees", volume.volumeId), published };
  }

  test("a file read and stat-ed right before the epoch is lost answers EIO on read and stat within a renewal of the loss", async () => {
    const { volumeId, target, tree, published } = await volumeOn("cache-fence.git", "cache-fence");
    assert.equal(await sh(`cat '${target}/a.txt'; stat -c %a '${target}/a.txt'`), "A\n644\n");
    // The kernel answers stat from its cache: a mode changed behind the mount is not seen.
    await fs.chmod(path.join(tree, "a.txt"), 0o600);
    assert.equal(await sh(`stat -c %a '${target}/a.txt'`), "644\n", "the attributes are the kernel's cached ones");

    const { replaced } = await takeOver(server, "cache-fence.git", volumeId);
    const lostAt = Date.now();
    await waitFor("stat of the cached file to fail with EIO", () => eio(`stat '${target}/a.txt'`), 20_000);
    const statFailed = Date.now() - lostAt;
    assert.equal(await eio(`cat '${target}/a.txt'`), true, "a read fails with EIO too");
    assert.ok(statFailed < 2 * RENEW_MS + 1000, `stat failed ${statFailed} ms after the loss: within a renewal, not when the cache would have run out`);
    assert.ok(Date.now() < Number(replaced?.expires), "well before the lost lease would have run out");
    assert.match(volumeLogs(driver, volumeId), /was taken over by node node-other/);
    await unpublishAndUnstage(driver, published);
  });

  test("after an application's first EIO nothing it had cached answers it, however many files the kernel holds", async () => {
    const count = 4000;
    const held = 400;
    const files = Object.fromEntries(Array.from({ length: count }, (_, i) => [`f${String(i).padStart(5, "0")}.txt`, `${i}\n`]));
    const name = "cache-many";
    await server.createRepo(`${name}.git`, { files: { "a.txt": "A\n", ...files } });
    const volume = await createVolume(driver, name, server.url(`${name}.git`));
    const published = await stageAndPublish(driver, volume, undefined, name);
    const app = await startCachedApp(published.targetPath, count, held);

    await takeOver(server, `${name}.git`, volume.volumeId);
    const outcome = await app.outcome;
    assert.ok(!outcome.timeout, "the mount kept serving for a minute after the takeover");
    assert.equal(outcome.first, "EIO");
    assert.deepEqual(outcome.reads.slice(0, 5), [], `${outcome.reads.length} of ${held} cached descriptors read after the first EIO`);
    assert.deepEqual(outcome.stats.slice(0, 5), [], `${outcome.stats.length} of ${count} cached files stat-ed after the first EIO`);
    await unpublishAndUnstage(driver, published);
  });

  test("a tree moved behind the mount is seen at once by a reader who had it cached", async () => {
    const name = "cache-move";
    const { volumeId, target, published } = await volumeOn(`${name}.git`, name);
    assert.equal(await sh(`cat '${target}/a.txt'; stat -c %s '${target}/a.txt'`), "A\n2\n");
    await server.commitFiles(`${name}.git`, { "a.txt": "upstream's A\n" }, { message: "a person's commit" });
    // The application's write is pushed, refused, rebased onto upstream's commit, and the tree moves.
    await sh(`echo mine > '${target}/mine.txt'`);
    await waitFor("GitVolumeRebased", async () => reasons(await report(driver, volumeId)).includes("GitVolumeRebased"));
    assert.equal(await sh(`cat '${target}/a.txt'; stat -c %s '${target}/a.txt'`), "upstream's A\n13\n", "the reader sees the moved tree at once");
    assert.equal(await sh(`cat '${target}/mine.txt'`), "mine\n");
    await unpublishAndUnstage(driver, published);
  });
});
