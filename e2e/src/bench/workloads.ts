// Section 1's workloads, each in its own process (dd, python3), each
// returning a throughput; the page cache is dropped before each timed step.
import * as path from "node:path";
import { type Config, MiB } from "./config";
import { checkInterrupted, exec, sh } from "./process";

export const SMALL_FILE_BYTES = 4096;
export type WorkloadId = "seq_write" | "seq_read" | "small_create" | "small_stat" | "small_stat_warm" | "sqlite_wal";
/** SQLite rows per transaction, as an application that batches its writes does. */
export const SQLITE_BATCH = 100;

/** target: issue 29's "Show", the least ours/direct it asks for (none for warm stat, which it did not measure). */
export const WORKLOADS: ReadonlyArray<{ id: WorkloadId; title: (c: Config) => string; unit: string; target?: number }> = [
  { id: "seq_write", title: (c) => `sequential write, ${size(c.seqMiB)} in 1 MiB blocks, fsync`, unit: "MB/s", target: 0.9 },
  { id: "seq_read", title: (c) => `sequential read, ${size(c.seqMiB)} in 1 MiB blocks`, unit: "MB/s", target: 0.9 },
  { id: "small_create", title: (c) => `create+write+close, ${c.files.toLocaleString("en-US")} files of 4 KiB`, unit: "files/s", target: 0.8 },
  { id: "small_stat", title: (c) => `stat, ${c.files.toLocaleString("en-US")} files`, unit: "stats/s", target: 0.8 },
  { id: "small_stat_warm", title: (c) => `stat again, warm: the same ${c.files.toLocaleString("en-US")} files, caches kept`, unit: "stats/s" },
  { id: "sqlite_wal", title: (c) => `SQLite WAL inserts, ${c.rows.toLocaleString("en-US")} rows in transactions of ${SQLITE_BATCH}`, unit: "rows/s", target: 0.9 },
];

export function size(mib: number): string {
  return mib % 1024 === 0 ? `${mib / 1024} GiB` : `${mib} MiB`;
}

async function dropCaches(): Promise<void> {
  checkInterrupted();
  await sh("sync; echo 3 > /proc/sys/vm/drop_caches");
}

/** dd's own figure: bytes and seconds from its last line (LC_ALL=C). */
function ddThroughput(stderr: string, expectedBytes: number): number {
  const match = /^(\d+) bytes .* copied, ([0-9.e+-]+) s,/m.exec(stderr);
  if (!match) throw new Error(`unexpected dd output: ${stderr.trim()}`);
  const bytes = Number(match[1]);
  const seconds = Number(match[2]);
  if (bytes !== expectedBytes) throw new Error(`dd moved ${bytes} bytes, expected ${expectedBytes}`);
  return bytes / seconds / 1e6;
}

async function seqWrite(file: string, mib: number): Promise<number> {
  const { stderr } = await exec("dd", ["if=/dev/zero", `of=${file}`, "bs=1M", `count=${mib}`, "conv=fsync"]);
  return ddThroughput(stderr, mib * MiB);
}

async function seqRead(file: string, mib: number): Promise<number> {
  const { stderr } = await exec("dd", [`if=${file}`, "of=/dev/null", "bs=1M"]);
  return ddThroughput(stderr, mib * MiB);
}

// The clock runs in the child, around the loop only: no interpreter start-up.
const CREATE_PY = `
import os, sys, time
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.mkdir(d)
names = [os.path.join(d, "f%05d" % i) for i in range(n)]
buf = b"x" * size
t = time.perf_counter()
for p in names:
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, buf)
    os.close(fd)
print(n / (time.perf_counter() - t))
`;

const STAT_PY = `
import os, sys, time
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = [os.path.join(d, "f%05d" % i) for i in range(n)]
t = time.perf_counter()
for p in names:
    if os.stat(p).st_size != size:
        sys.exit("wrong size: " + p)
print(n / (time.perf_counter() - t))
`;

// WAL mode with SQLite's default synchronous=FULL: each commit appends to the
// WAL and fsyncs it, as a database an application keeps on the volume does.
const SQLITE_PY = `
import os, sqlite3, sys, time
db, rows, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
con = sqlite3.connect(db, isolation_level=None)
if con.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
    sys.exit("WAL mode refused")
con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)")
payload = "x" * 100
t = time.perf_counter()
for start in range(0, rows, batch):
    con.execute("BEGIN")
    con.executemany("INSERT INTO t (payload) VALUES (?)", [(payload,)] * batch)
    con.execute("COMMIT")
elapsed = time.perf_counter() - t
if con.execute("SELECT count(*) FROM t").fetchone()[0] != rows:
    sys.exit("rows missing")
con.close()
print(rows / elapsed)
`;

async function python(script: string, ...args: string[]): Promise<number> {
  const { stdout } = await exec("python3", ["-c", script, ...args]);
  const value = Number(stdout.trim());
  if (!Number.isFinite(value) || value <= 0) throw new Error(`python3 printed ${JSON.stringify(stdout)}`);
  return value;
}

const smallCreate = (dir: string, files: number) => python(CREATE_PY, dir, String(files), String(SMALL_FILE_BYTES));
const smallStat = (dir: string, files: number) => python(STAT_PY, dir, String(files), String(SMALL_FILE_BYTES));
const sqliteWal = (db: string, rows: number) => python(SQLITE_PY, db, String(rows), String(SQLITE_BATCH));

/** One repetition of every workload in one base directory. */
export async function runOnce(base: string, config: Config, rep: number, record: (id: WorkloadId, value: number) => void): Promise<void> {
  const file = path.join(base, `seq-${rep}.bin`);
  await dropCaches();
  record("seq_write", await seqWrite(file, config.seqMiB));
  await dropCaches();
  record("seq_read", await seqRead(file, config.seqMiB));
  await sh('rm -f -- "$1"', file);

  const dir = path.join(base, `small-${rep}`);
  await dropCaches();
  record("small_create", await smallCreate(dir, config.files));
  await dropCaches();
  record("small_stat", await smallStat(dir, config.files));
  // No drop: an application re-reading its configuration finds what the kernel kept.
  record("small_stat_warm", await smallStat(dir, config.files));
  await sh('rm -rf -- "$1"', dir);

  const db = path.join(base, `sqlite-${rep}.db`);
  await dropCaches();
  record("sqlite_wal", await sqliteWal(db, config.rows));
  await sh('rm -f -- "$1" "$1-wal" "$1-shm"', db);
}
