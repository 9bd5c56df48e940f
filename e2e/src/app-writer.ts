// The application of the fault tests, a process of its own (the test process
// never touches a FUSE mount). It writes what real applications write:
// numbered files, each fsync'd; a settings file saved by rename over a temp
// file; and scratch files deleted a moment later. Each write it saw succeed
// is one JSON line in the acknowledged log, written outside the mount; a
// refused write (ENOTCONN, ENOSPC, EIO) is not acknowledged and is tried on.
//
//   node app-writer.js <dir> <ack-log> <interval-ms>   SIGTERM stops it
import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";

export interface AckedWrite {
  /** The path in the volume, and the git blob id of the exact content the application saw written. */
  file: string;
  blob: string;
}

/** The settings file an atomic save replaces: the remote must hold its last acknowledged content. */
export const SETTINGS = "settings.json";

/** The acknowledged log: the last entry of a path is what the remote must hold. */
export function readAcked(log: string): Map<string, string> {
  const acked = new Map<string, string>();
  for (const line of fs.readFileSync(log, "utf8").split("\n")) {
    if (line === "") continue;
    const write = JSON.parse(line) as AckedWrite;
    acked.set(write.file, write.blob);
  }
  return acked;
}

/** The id git gives this content: the remote's tree is compared by id, exactly and at once. */
export function blobId(content: string | Buffer): string {
  const bytes = Buffer.from(content);
  return createHash("sha1").update(`blob ${bytes.length}\0`).update(bytes).digest("hex");
}

function writeSynced(file: string, content: string | Buffer): void {
  const fd = fs.openSync(file, "w");
  try {
    fs.writeSync(fd, Buffer.from(content));
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** Every LARGE_EVERY-th step writes a large file, so commits are slow while scratch files come and go. */
const LARGE_EVERY = 120;
const LARGE_BYTES = 8 * 1024 * 1024;

/** One step of the application: n decides which kind of write. */
function step(dir: string, n: number): AckedWrite | undefined {
  if (n % LARGE_EVERY === LARGE_EVERY - 1) return written(dir, `media/${n}.bin`, randomBytes(LARGE_BYTES));
  switch (n % 3) {
    case 0: {
      const content = JSON.stringify({ save: n });
      const temp = path.join(dir, `.${SETTINGS}.tmp`);
      writeSynced(temp, content);
      fs.renameSync(temp, path.join(dir, SETTINGS));
      return { file: SETTINGS, blob: blobId(content) };
    }
    case 1: {
      const scratch = path.join(dir, `scratch-${n}.tmp`);
      writeSynced(scratch, "x".repeat(4096));
      fs.unlinkSync(scratch);
      return undefined;
    }
    default:
      return written(dir, `data/${String(n).padStart(5, "0")}.txt`, `write ${n}\n`);
  }
}

function written(dir: string, file: string, content: string | Buffer): AckedWrite {
  fs.mkdirSync(path.dirname(path.join(dir, file)), { recursive: true });
  writeSynced(path.join(dir, file), content);
  return { file, blob: blobId(content) };
}

function main(): void {
  const [dir, log, interval] = process.argv.slice(2);
  if (!dir || !log || !interval) {
    process.stderr.write("usage: app-writer <dir> <ack-log> <interval-ms>\n");
    process.exit(2);
  }
  const ackFd = fs.openSync(log, "a");
  let n = 0;
  let refused = 0;
  const timer = setInterval(() => {
    try {
      const acked = step(dir, n);
      if (acked) fs.writeSync(ackFd, `${JSON.stringify(acked)}\n`);
      n++;
    } catch {
      // Not acknowledged: the same step is tried again, as an application retries a save.
      refused++;
    }
  }, Number(interval));
  process.once("SIGTERM", () => {
    clearInterval(timer);
    fs.fsyncSync(ackFd);
    process.stdout.write(`${JSON.stringify({ steps: n, refused })}\n`);
    process.exit(0);
  });
}

if (require.main === module) main();
