// A real FUSE mount of a temp dir by our native server, driven from child
// processes (as an application would) so each runs with its own credentials.
// Plain fs calls here touch the backing tree and temp files.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { type FuseMount, mountFuse, resumeFuse, servingClock, setIncarnation, takeKept } from "../src/fuse/binding";

const execFileAsync = promisify(execFile);
const EIO = /Input\/output error/;
const NOBODY = 65534;

interface Volume {
  dir: string;
  backing: string;
  mnt: string;
}

function tempVolume(): Volume {
  const dir = fs.mkdtempSync("/tmp/fuse-test-");
  fs.chmodSync(dir, 0o755); // lets the non-root test reach the mountpoint
  const volume = { dir, backing: join(dir, "backing"), mnt: join(dir, "mnt") };
  fs.mkdirSync(volume.backing);
  fs.mkdirSync(volume.mnt);
  return volume;
}

/** Runs a shell script in a child process with $M the mountpoint, $B the backing dir. */
async function sh(volume: Volume, script: string, env: Record<string, string> = {}): Promise<string> {
  const { stdout } = await execFileAsync("sh", ["-c", script], {
    env: { ...process.env, M: volume.mnt, B: volume.backing, ...env },
    maxBuffer: 1 << 20,
  });
  return stdout;
}

/** Wraps a script (without single quotes) to run as nobody, with no supplementary groups. */
function asNobody(script: string): string {
  return `setpriv --reuid=${NOBODY} --regid=${NOBODY} --clear-groups sh -c '${script}'`;
}

/** Runs a script expected to fail; resolves to its stderr. */
async function shFails(volume: Volume, script: string): Promise<string> {
  try {
    await sh(volume, script);
  } catch (err) {
    return String((err as { stderr?: unknown }).stderr);
  }
  throw new assert.AssertionError({ message: `expected failure: ${script}` });
}

async function isMounted(mountpoint: string): Promise<boolean> {
  const mountinfo = await fs.promises.readFile("/proc/self/mountinfo", "utf8");
  return mountinfo.split("\n").some((line) => line.split(" ")[4] === mountpoint);
}

/** Detaches anything still mounted (a failed test's) before deleting, which would otherwise walk into the mount. */
async function removeVolume(volume: Volume): Promise<void> {
  if (await isMounted(volume.mnt)) await execFileAsync("fusermount", ["-uz", volume.mnt]);
  fs.rmSync(volume.dir, { recursive: true, force: true });
}

function backingStat(volume: Volume, name: string): fs.Stats {
  return fs.lstatSync(join(volume.backing, name));
}

function backingText(volume: Volume, name: string): string {
  return fs.readFileSync(join(volume.backing, name), "utf8");
}

function sha256(data: Buffer): string {
  return createHash("sha256").update(data).digest("hex");
}

async function eventually(check: () => boolean, what: string): Promise<void> {
  for (let tries = 0; tries < 50 && !check(); tries++) await sleep(50);
  assert.ok(check(), what);
}

describe("fuse passthrough", () => {
  const volume = tempVolume();
  let mount: FuseMount;

  before(() => {
    mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:test-volume" });
  });

  after(() => removeVolume(volume));

  test("mounts with the fsname, allow_other and default_permissions", async () => {
    assert.equal(mount.mountpoint, volume.mnt);
    const line = (await fs.promises.readFile("/proc/self/mountinfo", "utf8")).split("\n").find((l) => l.split(" ")[4] === volume.mnt);
    assert.match(line ?? "", / - fuse git-csi:test-volume rw,.*allow_other/);
    assert.match(line ?? "", /default_permissions/);
  });

  test("creates, writes, appends, overwrites in place and reads files", async () => {
    const out = await sh(volume, 'printf hello > "$M/a.txt" && printf " world" >> "$M/a.txt" && ' + 'printf HE | dd of="$M/a.txt" bs=1 conv=notrunc status=none && cat "$M/a.txt"');
    assert.equal(out, "HEllo world");
    assert.equal(backingText(volume, "a.txt"), "HEllo world");
  });

  test("reads files written to the backing tree", async () => {
    fs.writeFileSync(join(volume.backing, "from-git"), "committed\n");
    assert.equal(await sh(volume, 'cat "$M/from-git"'), "committed\n");
  });

  // With the writeback cache the kernel trusts its own size and pages of a
  // cached inode; git never rewrites a file in place but replaces it (unlink,
  // then a new file), and the git worker has the mount invalidated after each
  // tree move, so the name leads to the new inode at once.
  test("a file git replaces in the backing tree is read anew once the mount is invalidated, whatever the kernel cached of the old one", async () => {
    assert.equal(await sh(volume, 'printf "the application wrote this\\n" > "$M/replaced" && cat "$M/replaced"'), "the application wrote this\n");
    fs.unlinkSync(join(volume.backing, "replaced"));
    fs.writeFileSync(join(volume.backing, "replaced"), "upstream\n");
    assert.equal(await sh(volume, 'stat -c %s "$M/replaced"'), "27\n", "the kernel answers from its cache until told");
    mount.invalidate();
    assert.equal(await sh(volume, 'cat "$M/replaced"; stat -c %s "$M/replaced"'), "upstream\n9\n");
  });

  // The kernel moved its entry with the rename: the invalidation must name the entry where it is now.
  test("a file the application renamed, then git replaced, is read anew once the mount is invalidated", async () => {
    await sh(volume, 'echo first > "$M/old-name" && mv "$M/old-name" "$M/new-name" && cat "$M/new-name"');
    fs.unlinkSync(join(volume.backing, "new-name"));
    fs.writeFileSync(join(volume.backing, "new-name"), "upstream\n");
    mount.invalidate();
    assert.equal(await sh(volume, 'cat "$M/new-name"'), "upstream\n");
  });

  // The git worker asks for this before it moves the tree: git sees the backing tree only.
  test("sync sends pages the kernel still holds to the backing tree at once", async () => {
    fs.writeFileSync(join(volume.backing, "held"), "base\n");
    const fd = fs.openSync(join(volume.mnt, "held"), "r+");
    try {
      fs.writeSync(fd, "pod!\n", 0);
      assert.equal(backingText(volume, "held"), "base\n", "the write waits in the kernel's writeback cache");
      assert.equal(await mount.sync(), true);
      assert.equal(backingText(volume, "held"), "pod!\n");
    } finally {
      fs.closeSync(fd);
    }
  });

  test("creates files with the exact mode the app asked for", async () => {
    await sh(volume, 'umask 002 && echo x > "$M/shared" && mkdir "$M/shared-dir"');
    assert.equal(backingStat(volume, "shared").mode & 0o7777, 0o664);
    assert.equal(backingStat(volume, "shared-dir").mode & 0o7777, 0o775);
  });

  test("mkdir keeps the setgid bit inherited from the parent", async () => {
    fs.mkdirSync(join(volume.backing, "sgid"));
    fs.chmodSync(join(volume.backing, "sgid"), 0o2775);
    await sh(volume, 'mkdir "$M/sgid/child"');
    assert.equal(backingStat(volume, "sgid/child").mode & 0o7777, 0o2755);
  });

  test("mkdir, readdir with . and .., rmdir", async () => {
    await sh(volume, 'mkdir "$M/d" && touch "$M/d/x"');
    assert.ok(backingStat(volume, "d").isDirectory());
    assert.equal(await sh(volume, 'ls -a "$M/d"'), ".\n..\nx\n");
    assert.match(await shFails(volume, 'rmdir "$M/d"'), /Directory not empty/);
    await sh(volume, 'rm "$M/d/x" && rmdir "$M/d"');
    assert.equal(fs.existsSync(join(volume.backing, "d")), false);
  });

  test("renames, also over an existing file", async () => {
    await sh(volume, 'echo one > "$M/r1" && echo two > "$M/r2" && mv "$M/r1" "$M/r2" && mv "$M/r2" "$M/r3"');
    assert.equal(fs.existsSync(join(volume.backing, "r1")), false);
    assert.equal(fs.existsSync(join(volume.backing, "r2")), false);
    assert.equal(backingText(volume, "r3"), "one\n");
  });

  test("unlinks", async () => {
    await sh(volume, 'echo x > "$M/gone" && rm "$M/gone"');
    assert.equal(fs.existsSync(join(volume.backing, "gone")), false);
  });

  test("symlinks store the target as given; readlink returns it", async () => {
    const out = await sh(volume, 'echo target > "$M/t" && ln -s t "$M/l" && ln -s ../../elsewhere "$M/out" && ' + 'readlink "$M/out" && cat "$M/l"');
    assert.equal(out, "../../elsewhere\ntarget\n");
    assert.ok(backingStat(volume, "out").isSymbolicLink());
    assert.equal(fs.readlinkSync(join(volume.backing, "out")), "../../elsewhere");
    assert.equal(fs.readlinkSync(join(volume.backing, "l")), "t");
  });

  test("hard links share the backing inode", async () => {
    await sh(volume, 'echo shared > "$M/h1" && ln "$M/h1" "$M/h2"');
    const [h1, h2] = [backingStat(volume, "h1"), backingStat(volume, "h2")];
    assert.equal(h1.ino, h2.ino);
    assert.equal(h1.nlink, 2);
  });

  test("chown and chmod reach the backing tree", async () => {
    await sh(volume, 'echo x > "$M/owned" && chown 1234:5678 "$M/owned" && chmod 4751 "$M/owned"');
    let stat = backingStat(volume, "owned");
    assert.deepEqual([stat.uid, stat.gid, stat.mode & 0o7777], [1234, 5678, 0o4751]);
    assert.equal(await sh(volume, 'stat -c "%u %g %a" "$M/owned"'), "1234 5678 4751\n");

    await sh(volume, 'chown :99 "$M/owned"'); // uid "unchanged" arrives as (uid_t)-1
    stat = backingStat(volume, "owned");
    assert.deepEqual([stat.uid, stat.gid], [1234, 99]);
  });

  test("truncates by path, by descriptor and on open", async () => {
    await sh(volume, 'printf 0123456789 > "$M/tr" && truncate -s 3 "$M/tr"');
    assert.equal(backingText(volume, "tr"), "012");
    await sh(volume, "python3 -c \"import os; f = open(os.environ['M'] + '/tr', 'r+'); f.truncate(1); f.close()\"");
    assert.equal(backingText(volume, "tr"), "0");
    await sh(volume, 'truncate -s 5000 "$M/tr"');
    assert.equal(backingStat(volume, "tr").size, 5000);
    await sh(volume, ': > "$M/tr"');
    assert.equal(backingStat(volume, "tr").size, 0);
  });

  test("utimens sets atime and mtime to the nanosecond", async () => {
    await sh(volume, 'touch "$M/times" && touch -d "2001-01-01 00:00:00 UTC" "$M/times"');
    assert.equal(backingStat(volume, "times").mtimeMs, Date.UTC(2001, 0, 1));

    const [atimeNs, mtimeNs] = [1_000_000_000_123_456_789n, 978_307_200_987_654_321n];
    await sh(volume, `python3 -c 'import os; os.utime(os.environ["M"] + "/times", ns=(${atimeNs}, ${mtimeNs}))'`);
    const stat = fs.lstatSync(join(volume.backing, "times"), { bigint: true });
    assert.deepEqual([stat.atimeNs, stat.mtimeNs], [atimeNs, mtimeNs]);
    assert.equal(await sh(volume, 'stat -c %Y "$M/times"'), `${mtimeNs / 1_000_000_000n}\n`);
  });

  test("touch -m and touch -a set one time and leave the other (UTIME_OMIT)", async () => {
    await sh(volume, 'touch -d "2010-06-01 00:00:00 UTC" "$M/one-time"');
    await sh(volume, 'touch -m -d "2001-02-03 00:00:00 UTC" "$M/one-time"');
    let stat = backingStat(volume, "one-time");
    assert.deepEqual([stat.mtimeMs, stat.atimeMs], [Date.UTC(2001, 1, 3), Date.UTC(2010, 5, 1)]);
    await sh(volume, 'touch -a -d "2002-03-04 00:00:00 UTC" "$M/one-time"');
    stat = backingStat(volume, "one-time");
    assert.deepEqual([stat.mtimeMs, stat.atimeMs], [Date.UTC(2001, 1, 3), Date.UTC(2002, 2, 4)]);
  });

  test("touch without a date sets both times to now (UTIME_NOW), also for a non-owner with write access", async () => {
    fs.writeFileSync(join(volume.backing, "now"), "");
    fs.chmodSync(join(volume.backing, "now"), 0o666);
    fs.utimesSync(join(volume.backing, "now"), 1_000_000, 1_000_000);
    const before = Date.now() - 2000;
    await sh(volume, asNobody('touch "$M/now"'));
    const stat = backingStat(volume, "now");
    assert.ok(stat.mtimeMs >= before && stat.atimeMs >= before, `mtime ${stat.mtimeMs}`);
  });

  test("a 64 MiB dd write lands intact", async () => {
    const source = join(volume.dir, "source.bin");
    const data = randomBytes(64 << 20);
    fs.writeFileSync(source, data);
    await sh(volume, 'dd if="$SRC" of="$M/big" bs=1M conv=fsync status=none', { SRC: source });
    assert.equal(sha256(fs.readFileSync(join(volume.backing, "big"))), sha256(data));
    assert.equal((await sh(volume, 'sha256sum < "$M/big"')).split(" ")[0], sha256(data));
  });

  test("open-unlinked files keep working, and leave no name behind", async () => {
    const script = [
      "import os",
      'm, b = os.environ["M"], os.environ["B"]',
      'f = open(m + "/scratch", "w+")',
      'os.unlink(m + "/scratch")',
      'f.write("abc"); f.flush()',
      "print(os.fstat(f.fileno()).st_size)",
      "f.seek(0); print(f.read())",
      'print(os.listdir(b).count("scratch"))',
      "f.close()",
    ].join("\n");
    assert.equal(await sh(volume, 'python3 -c "$PY"', { PY: script }), "3\nabc\n0\n");
  });

  test("statfs reports the backing file system", async () => {
    const [blockSize, blocks] = (await sh(volume, 'stat -f -c "%S %b" "$M"')).trim().split(" ").map(Number);
    const backing = fs.statfsSync(volume.backing);
    assert.equal(blockSize * blocks, backing.bsize * backing.blocks);
  });

  test("a non-root app owns what it creates in its directory; modes are enforced", async () => {
    fs.mkdirSync(join(volume.backing, "home"));
    fs.chownSync(join(volume.backing, "home"), NOBODY, NOBODY);
    fs.writeFileSync(join(volume.backing, "root-only"), "root\n", { mode: 0o644 });

    await sh(volume, asNobody('echo mine > "$M/home/f" && echo more >> "$M/home/f" && mkdir "$M/home/sub" && ln -s f "$M/home/l"'));
    for (const name of ["home/f", "home/sub", "home/l"]) {
      const stat = backingStat(volume, name);
      assert.deepEqual([stat.uid, stat.gid], [NOBODY, NOBODY], name);
    }
    assert.equal(backingText(volume, "home/f"), "mine\nmore\n");

    assert.match(await shFails(volume, asNobody('echo x > "$M/root-only"')), /Permission denied/);
    assert.equal(backingText(volume, "root-only"), "root\n");
  });

  test("the process serving the mount may itself use it, synchronously: no JavaScript serves an operation", () => {
    fs.writeFileSync(join(volume.mnt, "self"), "written by the server's own thread\n");
    fs.appendFileSync(join(volume.mnt, "self"), "and again\n");
    assert.equal(fs.readFileSync(join(volume.mnt, "self"), "utf8"), "written by the server's own thread\nand again\n");
    assert.equal(backingText(volume, "self"), "written by the server's own thread\nand again\n");
  });

  test("unmount leaves no mount behind", async () => {
    await mount.unmount();
    assert.equal(await isMounted(volume.mnt), false);
    assert.equal(backingText(volume, "a.txt"), "HEllo world");
  });
});

describe("caller identity and POSIX behaviour", () => {
  const volume = tempVolume();
  let mount: FuseMount;

  before(() => {
    mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:posix" });
    fs.mkdirSync(join(volume.backing, "open"), { mode: 0o777 });
    fs.chmodSync(join(volume.backing, "open"), 0o777);
  });

  after(async () => {
    await mount.unmount();
    await removeVolume(volume);
  });

  test("a file, directory, symlink and node take the caller's uid and gid", async () => {
    await sh(volume, asNobody('cd "$M/open" && echo f > f && mkdir d && ln -s f l && mkfifo p'));
    for (const name of ["f", "d", "l", "p"]) {
      const stat = backingStat(volume, `open/${name}`);
      assert.deepEqual([stat.uid, stat.gid], [NOBODY, NOBODY], name);
    }
    assert.equal(await sh(volume, 'stat -c "%u %g" "$M/open/f"'), `${NOBODY} ${NOBODY}\n`);
  });

  test("in a setgid directory a new entry takes the directory's group, a new directory its setgid bit", async () => {
    fs.mkdirSync(join(volume.backing, "team"));
    fs.chownSync(join(volume.backing, "team"), 0, 1234);
    fs.chmodSync(join(volume.backing, "team"), 0o2777);
    await sh(volume, asNobody('umask 022 && echo f > "$M/team/f" && mkdir "$M/team/d"'));
    const [file, dir] = [backingStat(volume, "team/f"), backingStat(volume, "team/d")];
    assert.deepEqual([file.uid, file.gid, file.mode & 0o7777], [NOBODY, 1234, 0o644]);
    assert.deepEqual([dir.uid, dir.gid, dir.mode & 0o7777], [NOBODY, 1234, 0o2755]);
  });

  test("a member of a directory's group by a supplementary group only creates in it", async () => {
    fs.mkdirSync(join(volume.backing, "group-only"));
    fs.chownSync(join(volume.backing, "group-only"), 0, 1000);
    fs.chmodSync(join(volume.backing, "group-only"), 0o2775);
    await sh(volume, `setpriv --reuid=1000 --regid=2000 --groups=1000 sh -c 'echo x > "$M/group-only/f" && mkdir "$M/group-only/d"'`);
    const stat = backingStat(volume, "group-only/f");
    assert.deepEqual([stat.uid, stat.gid], [1000, 1000]);
    assert.match(await shFails(volume, asNobody('echo x > "$M/group-only/g"')), /Permission denied/);
  });

  test("rename with RENAME_NOREPLACE refuses an existing name; RENAME_EXCHANGE swaps", async () => {
    const script = [
      "import ctypes, os",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "def rename(a, b, flags):",
      '    m = os.environ["M"].encode()',
      '    r = libc.renameat2(-100, m + b"/" + a, -100, m + b"/" + b, flags)',
      '    return os.strerror(ctypes.get_errno()) if r else "ok"',
      'open(os.environ["M"] + "/x1", "w").write("one")',
      'open(os.environ["M"] + "/x2", "w").write("two")',
      'print(rename(b"x1", b"x2", 1))', // RENAME_NOREPLACE
      'print(rename(b"x1", b"x2", 2))', // RENAME_EXCHANGE
      'print(rename(b"x1", b"x3", 1))',
    ].join("\n");
    assert.equal(await sh(volume, 'python3 -c "$PY"', { PY: script }), "File exists\nok\nok\n");
    assert.equal(backingText(volume, "x2"), "one");
    assert.equal(backingText(volume, "x3"), "two");
  });

  test("fallocate, fsync and fdatasync reach the backing file", async () => {
    await sh(volume, 'fallocate -l 1M "$M/alloc"');
    assert.equal(backingStat(volume, "alloc").size, 1 << 20);
    assert.ok(backingStat(volume, "alloc").blocks * 512 >= 1 << 20);
    const script = 'import os\nfd = os.open(os.environ["M"] + "/synced", os.O_CREAT | os.O_WRONLY)\nos.write(fd, b"s")\nos.fsync(fd)\nos.fdatasync(fd)\nos.close(fd)';
    await sh(volume, 'python3 -c "$PY"', { PY: script });
    assert.equal(backingText(volume, "synced"), "s");
  });

  test("flock and POSIX locks exclude another process", async () => {
    await sh(volume, 'touch "$M/lock"');
    assert.equal(await sh(volume, 'flock -n "$M/lock" sh -c \'flock -n "$M/lock" true && echo taken || echo refused\''), "refused\n");
    const script = [
      "import fcntl, os, subprocess, sys",
      'f = open(os.environ["M"] + "/lock", "r+")',
      "fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
      "other = \"import fcntl, os\\ntry:\\n  fcntl.lockf(open(os.environ['M'] + '/lock', 'r+'), fcntl.LOCK_EX | fcntl.LOCK_NB); print('taken')\\nexcept OSError: print('refused')\"",
      'print(subprocess.run([sys.executable, "-c", other], capture_output=True, text=True).stdout.strip())',
    ].join("\n");
    assert.equal(await sh(volume, 'python3 -c "$PY"', { PY: script }), "refused\n");
  });

  test("never follows a symlink out of the backing tree", async () => {
    const outside = join(volume.dir, "outside");
    fs.writeFileSync(outside, "outside\n", { mode: 0o600 });
    fs.symlinkSync(outside, join(volume.backing, "escape"));
    assert.equal(await sh(volume, 'stat -c %F "$M/escape"'), "symbolic link\n");
    await sh(volume, 'chown -h 1234:1234 "$M/escape" && touch -h -d 2001-02-03 "$M/escape"');
    const target = fs.statSync(outside);
    assert.deepEqual([target.mode & 0o777, target.uid, target.size], [0o600, 0, 8]);
    assert.equal(backingStat(volume, "escape").uid, 1234);
  });
});

/** A python process on the mount that runs one command per stdin line and prints each answer. */
interface Application {
  ask(command: string): Promise<string>;
  exited: Promise<number | null>;
  kill(): void;
}

const APPLICATION = `
import mmap, os, sys
m = os.environ["M"]
held = {}
def attempt(f):
    try:
        return "ok " + str(f())
    except OSError as e:
        return os.strerror(e.errno)
commands = {
    "open": lambda: held.setdefault("fd", os.open(m + "/held", os.O_RDWR)),
    "map": lambda: held.setdefault("map", mmap.mmap(held["fd"], 0, mmap.MAP_SHARED)) and 0,
    "pread": lambda: os.pread(held["fd"], 100, 0).decode(),
    "write": lambda: os.pwrite(held["fd"], b"late", 0),
    "stat": lambda: os.stat(m + "/held").st_size,
    "fstat": lambda: os.fstat(held["fd"]).st_size,
    "mapped": lambda: held["map"][:6].decode(),
    "create": lambda: os.close(os.open(m + "/new", os.O_CREAT | os.O_WRONLY)),
}
for line in sys.stdin:
    print(attempt(commands[line.strip()]), flush=True)
`;

function startApplication(volume: Volume): Application {
  const proc = spawn("python3", ["-c", APPLICATION], { env: { ...process.env, M: volume.mnt }, stdio: ["pipe", "pipe", "inherit"] });
  const lines: string[] = [];
  let waiting: ((line: string) => void) | undefined;
  let buffered = "";
  proc.stdout.on("data", (chunk: Buffer) => {
    buffered += chunk.toString();
    for (let at = buffered.indexOf("\n"); at >= 0; at = buffered.indexOf("\n")) {
      const line = buffered.slice(0, at);
      buffered = buffered.slice(at + 1);
      if (waiting) {
        waiting(line);
        waiting = undefined;
      } else lines.push(line);
    }
  });
  const exited = new Promise<number | null>((resolve) => proc.on("exit", (code, signal) => resolve(signal ? -1 : code)));
  return {
    ask: (command) => {
      proc.stdin.write(`${command}\n`);
      const line = lines.shift();
      if (line !== undefined) return Promise.resolve(line);
      return Promise.race([new Promise<string>((resolve) => (waiting = resolve)), exited.then((code) => `exited ${code}`)]);
    },
    exited,
    kill: () => proc.kill("SIGKILL"),
  };
}

describe("epoch fence", () => {
  test("fenced: every operation answers EIO at once, also through a descriptor and a mapping made before", async () => {
    const volume = tempVolume();
    const refusals: number[] = [];
    const mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:fenced", epoch: { serveUntilMs: Infinity, onFenced: (n) => refusals.push(n) } });
    let app: Application | undefined;
    try {
      fs.writeFileSync(join(volume.backing, "held"), "cached");
      app = startApplication(volume);
      assert.equal(await app.ask("open"), "ok 3");
      assert.equal(await app.ask("map"), "ok 0");
      assert.equal(await app.ask("pread"), "ok cached");
      assert.equal(await app.ask("mapped"), "ok cached");
      assert.equal(await app.ask("stat"), "ok 6");

      mount.fence();
      // The kernel dropped the pages and attributes it cached: nothing answers from them.
      assert.equal(await app.ask("stat"), "Input/output error");
      assert.equal(await app.ask("fstat"), "Input/output error");
      assert.equal(await app.ask("pread"), "Input/output error");
      assert.equal(await app.ask("write"), "Input/output error");
      assert.equal(await app.ask("create"), "Input/output error");
      assert.match(await shFails(volume, 'ls "$M"'), EIO);
      // A page of the shared mapping is read again, and fails: SIGBUS, not a stale page.
      assert.equal(await app.ask("mapped"), "exited -1");
      assert.equal(fs.readFileSync(join(volume.backing, "held"), "utf8"), "cached");
      assert.equal(fs.existsSync(join(volume.backing, "new")), false);
      await eventually(() => refusals.reduce((a, b) => a + b, 0) >= 5, "the refusals are counted");
    } finally {
      app?.kill();
      await mount.unmount();
      await removeVolume(volume);
    }
  });

  test("the lease's end fences without a call: operations fail from then on, and JavaScript hears of it", async () => {
    const volume = tempVolume();
    const refusals: number[] = [];
    const mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:lease", epoch: { serveUntilMs: servingClock() + 60_000, onFenced: (n) => refusals.push(n) } });
    try {
      await sh(volume, 'echo before > "$M/f" && cat "$M/f"');
      mount.serveUntil(servingClock() + 1000);
      await sh(volume, 'echo still >> "$M/f"');
      await sleep(1200);
      assert.match(await shFails(volume, 'cat "$M/f"'), EIO);
      assert.match(await shFails(volume, 'stat "$M/f"'), EIO);
      assert.equal(backingText(volume, "f"), "before\nstill\n");
      await eventually(() => refusals.length > 0, "onFenced was called");
    } finally {
      await mount.unmount();
      await removeVolume(volume);
    }
  });
});

describe("mount options", () => {
  const volume = tempVolume();
  after(() => removeVolume(volume));

  test("an fsname cannot smuggle in mount options", async () => {
    const mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:odd,ro\\name" });
    try {
      const line = (await fs.promises.readFile("/proc/self/mountinfo", "utf8")).split("\n").find((l) => l.split(" ")[4] === volume.mnt);
      assert.match(line ?? "", / - fuse git-csi:odd,ro\\134name rw,/);
      await sh(volume, 'echo writable > "$M/f"');
      assert.equal(backingText(volume, "f"), "writable\n");
    } finally {
      await mount.unmount();
    }
  });

  test("a sync answers that nothing is mounted once another process unmounted it, and after our own unmount", async () => {
    const mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:synced" });
    try {
      await execFileAsync("umount", [volume.mnt]);
      assert.equal(await mount.sync(), false);
    } finally {
      await mount.unmount();
    }
    assert.equal(await mount.sync(), false);
  });
});

describe("a dead mount owner", () => {
  const volume = tempVolume();
  after(() => removeVolume(volume));

  test("leaves an ENOTCONN mount that the next mount replaces", async () => {
    await mountInChildAndKill(volume);
    assert.equal(await isMounted(volume.mnt), true);
    assert.match(await shFails(volume, 'stat "$M"'), /Transport endpoint is not connected/);

    const mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:restarted" });
    await sh(volume, 'echo back > "$M/f"');
    assert.equal(backingText(volume, "f"), "back\n");
    await mount.unmount();
    assert.equal(await isMounted(volume.mnt), false);
  });
});

/** Mounts the volume from a child node process, then SIGKILLs it. */
async function mountInChildAndKill(volume: Volume): Promise<void> {
  await (await mountInChild(volume)).kill();
}

/** Mounts the volume from a child node process, the connection handed to the keeper at keeperSocket if one is named. */
async function mountInChild(volume: Volume, keeperSocket = ""): Promise<{ kill(): Promise<void> }> {
  const script = `
    const { mountFuse } = require(${JSON.stringify(require.resolve("../src/fuse/binding"))});
    const mount = mountFuse({ mountpoint: process.env.M, backing: process.env.B, fsname: 'git-csi:dead' });
    if (process.env.K) mount.keep(process.env.K, 'test-volume');
    console.log('mounted');
    setInterval(() => undefined, 1000);`;
  const child = spawn(process.execPath, ["-e", script], {
    env: { ...process.env, M: volume.mnt, B: volume.backing, K: keeperSocket },
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout.on("data", (chunk: Buffer) => chunk.toString().includes("mounted") && resolve());
    child.on("exit", (code) => reject(new Error(`mount child exited with ${code}`)));
  });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  return {
    kill: async () => {
      child.kill("SIGKILL");
      await exited;
    },
  };
}

/**
 * The application of the resume test: takes a descriptor of an open file, one
 * of an open directory and a working directory deep in the mount, says
 * "ready", and after a line on stdin uses all three and prints what it saw.
 */
const HOLDER = `
import json, os, sys
os.chdir(os.path.join(sys.argv[1], "a/b/c"))
f = os.open("log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
d = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
os.write(f, b"before\\n")
print("ready", flush=True)
sys.stdin.readline()
os.write(f, b"after\\n")
os.fsync(f)
print(json.dumps({"entries": sorted(os.listdir(d)), "deep": open("sub/deep.txt").read(), "stat": os.stat("log").st_size}), flush=True)
`;

describe("a graceful stop", () => {
  test("quiesce returns at once for a mount whose connection already ended", { timeout: 10_000 }, async () => {
    const volume = tempVolume();
    try {
      const mount = mountFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:ended" });
      await sh(volume, 'ls "$M" && umount "$M"');
      await sleep(200);
      mount.quiesce();
    } finally {
      await removeVolume(volume);
    }
  });
});

test("the descriptor keeper leaves on SIGTERM as process 1 of its namespace, as in its container", { timeout: 30_000 }, async () => {
  const volume = tempVolume();
  try {
    const keeperSocket = join(volume.dir, "keeper.sock");
    // A new pid namespace makes the keeper its process 1, which the kernel spares every signal it has no handler for.
    const ns = spawn("unshare", ["--pid", "--fork", "--kill-child", join(__dirname, "../native/gitcsi-fd-keeper"), keeperSocket], { stdio: ["ignore", "ignore", "pipe"] });
    let said = "";
    ns.stderr.on("data", (chunk: Buffer) => (said += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => ns.once("exit", resolve));
    await eventually(() => fs.existsSync(keeperSocket), "the keeper listens");
    const keeper = Number(fs.readFileSync(`/proc/${ns.pid}/task/${ns.pid}/children`, "utf8").trim());
    process.kill(keeper, "SIGTERM");
    const code = await Promise.race([exited, new Promise<string>((r) => setTimeout(() => r("still running 10 s after SIGTERM"), 10_000))]);
    if (typeof code === "string") ns.kill("SIGKILL");
    assert.equal(code, 0, said);
    assert.match(said, /stopping: the mount owner's copies keep every mount/);
  } finally {
    await removeVolume(volume);
  }
});

describe("a connection kept across a restart of its server", () => {
  const volume = tempVolume();
  const keeperSocket = join(volume.dir, "keeper.sock");
  let keeper: ReturnType<typeof spawn>;

  before(async () => {
    keeper = spawn(join(__dirname, "../native/gitcsi-fd-keeper"), [keeperSocket], { stdio: "ignore" });
    await eventually(() => fs.existsSync(keeperSocket), "the keeper listens");
  });

  after(async () => {
    keeper.kill("SIGKILL");
    await removeVolume(volume);
  });

  test("a new process serves it: open files, open directories and every node id the kernel held carry on", async () => {
    fs.mkdirSync(join(volume.backing, "a/b/c/sub"), { recursive: true });
    fs.writeFileSync(join(volume.backing, "a/b/c/sub/deep.txt"), "deep\n");
    setIncarnation(1);
    const first = await mountInChild(volume, keeperSocket);
    const app = spawn("python3", ["-c", HOLDER, volume.mnt], { stdio: ["pipe", "pipe", "inherit"] });
    let out = "";
    app.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    await eventually(() => out.includes("ready"), "the application holds its descriptors");
    await first.kill();

    // This process is the next server: another incarnation, the kept descriptor, the kernel's INIT replayed.
    setIncarnation(2);
    const kept = takeKept(keeperSocket);
    assert.deepEqual(
      kept.map((k) => k.key),
      ["test-volume"],
    );
    const mount = resumeFuse({ mountpoint: volume.mnt, backing: volume.backing, fsname: "git-csi:test-volume" }, kept[0]!);
    app.stdin.end("go\n");
    await new Promise((resolve) => app.once("exit", resolve));
    const seen = JSON.parse(out.slice(out.indexOf("{"))) as { entries: string[]; deep: string; stat: number };
    assert.deepEqual(seen, { entries: ["log", "sub"], deep: "deep\n", stat: "before\nafter\n".length });
    assert.equal(backingText(volume, "a/b/c/log"), "before\nafter\n");
    await mount.unmount();
    assert.equal(await isMounted(volume.mnt), false);
  });
});
