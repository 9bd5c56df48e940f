// FuseBinding over fuse-native 2.2.6 (libfuse 2.9 high-level API, callback style).
import type {
  FuseBinding,
  FuseMount,
  FuseMountOptions,
  FuseOperations,
  FuseStat,
  FuseStatfs,
} from './binding';
import { errnoOf, FuseError } from './binding';

type Reply = (code: number, value?: unknown) => void;
type NativeHandler = (locals: Buffer, op: number, ...args: unknown[]) => void;

interface NativeFuse {
  readonly mnt: string;
  /** fuse-native's per-opcode dispatchers, read by the native side at mount. */
  _handlers: NativeHandler[];
  mount(cb: (err: Error | null) => void): void;
  unmount(cb: (err: Error | null) => void): void;
}

interface NativeOptions {
  fsname: string;
  timeout: Record<string, false>;
  allowOther: boolean;
  defaultPermissions: boolean;
  autoUnmount: boolean;
  force: boolean;
  mkdir: boolean;
}

type NativeFuseClass = new (
  mountpoint: string,
  ops: Record<string, (...args: never[]) => void>,
  options: NativeOptions,
) => NativeFuse;

// fuse-native ships no types; its shape is declared above.
const NativeFuse = require('fuse-native') as NativeFuseClass;

const UINT32_LIMIT = 2 ** 32;
const UNSET_ID = UINT32_LIMIT - 1;

export const fuseNative: FuseBinding = { mount };

async function mount(opts: FuseMountOptions): Promise<FuseMount> {
  const fuse = new NativeFuse(opts.mountpoint, nativeOps(opts.ops), nativeOptions(opts.fsname));
  recoverUtimensMtime(fuse);
  await new Promise<void>((resolve, reject) => fuse.mount((err) => (err ? reject(err) : resolve())));
  return {
    mountpoint: fuse.mnt,
    unmount: () =>
      new Promise<void>((resolve, reject) => fuse.unmount((err) => (err ? reject(err) : resolve()))),
  };
}

function nativeOptions(fsname: string): NativeOptions {
  return {
    // fuse-native has no big_writes option, but joins fsname into the -o list
    // unescaped; 128 KiB writes instead of 4 KiB raised throughput 5x.
    fsname: `${escapeOptionValue(fsname)},big_writes`,
    // fuse-native answers an op that is slow for 15 s with ETIMEDOUT; a read
    // or write finishing later would fill a buffer libfuse has reused.
    timeout: { read: false, write: false },
    allowOther: true,
    defaultPermissions: true,
    // A dead owner must leave an ENOTCONN mount for unstage to find.
    autoUnmount: false,
    // Replaces such a dead mount (ENOTCONN) when the owner comes back.
    force: true,
    // The staging directory is kubelet's to create.
    mkdir: false,
  };
}

/** libfuse splits -o at unescaped commas: escaped, a name cannot add options. */
function escapeOptionValue(value: string): string {
  return value.replace(/[\\,]/g, '\\$&');
}

function nativeOps(ops: FuseOperations): Record<string, (...args: never[]) => void> {
  return {
    // No fgetattr: fuse-native would route it to getattr(path) anyway, as
    // libfuse does without it. Open-unlinked files still stat because libfuse
    // renames them to .fuse_hidden* in the backing tree until released.
    getattr: (path: string, cb: Reply) => answer(ops.getattr(path).then(nativeStat), cb),
    readdir: (path: string, cb: Reply) => answer(ops.readdir(path), cb),
    open: (path: string, flags: number, cb: Reply) => answer(ops.open(path, flags), cb),
    create: (path: string, mode: number, cb: Reply) => answer(ops.create(path, mode), cb),
    read: (path: string, fh: number, buf: Buffer, len: number, pos: number, cb: Reply) =>
      answerCount(ops.read(path, fh, buf.subarray(0, len), pos), cb),
    write: (path: string, fh: number, buf: Buffer, len: number, pos: number, cb: Reply) =>
      answerCount(ops.write(path, fh, buf.subarray(0, len), pos), cb),
    release: (path: string, fh: number, cb: Reply) => answer(ops.release(path, fh), cb),
    fsync: (path: string, datasync: number, fh: number, cb: Reply) =>
      answer(ops.fsync(path, fh, datasync !== 0), cb),
    truncate: (path: string, size: number, cb: Reply) => answer(ops.truncate(path, size), cb),
    ftruncate: (path: string, fh: number, size: number, cb: Reply) =>
      answer(ops.ftruncate(path, fh, size), cb),
    unlink: (path: string, cb: Reply) => answer(ops.unlink(path), cb),
    rename: (from: string, to: string, cb: Reply) => answer(ops.rename(from, to), cb),
    mkdir: (path: string, mode: number, cb: Reply) => answer(ops.mkdir(path, mode), cb),
    rmdir: (path: string, cb: Reply) => answer(ops.rmdir(path), cb),
    symlink: (target: string, path: string, cb: Reply) => answer(ops.symlink(target, path), cb),
    readlink: (path: string, cb: Reply) => answer(ops.readlink(path), cb),
    link: (existing: string, path: string, cb: Reply) => answer(ops.link(existing, path), cb),
    chmod: (path: string, mode: number, cb: Reply) => answer(ops.chmod(path, mode), cb),
    chown: (path: string, uid: number, gid: number, cb: Reply) =>
      answer(ops.chown(path, signedId(uid), signedId(gid)), cb),
    utimens: (path: string, atime: number, mtime: number, cb: Reply) =>
      answer(Number.isNaN(mtime) ? unrecoveredMtime() : ops.utimens(path, atime, mtime), cb),
    statfs: (path: string, cb: Reply) => answer(ops.statfs(path).then(nativeStatfs), cb),
  };
}

/** fuse-native's usual reply: (0, value) or (-errno). */
function answer(work: Promise<unknown>, cb: Reply): void {
  work.then(
    (value) => cb(0, value),
    (err: unknown) => cb(-errnoOf(err)),
  );
}

/** read and write reply with the byte count in the status slot. */
function answerCount(work: Promise<number>, cb: Reply): void {
  work.then(
    (count) => cb(count),
    (err: unknown) => cb(-errnoOf(err)),
  );
}

/** libfuse passes (uid_t)-1 for "unchanged" as an unsigned 32-bit value. */
function signedId(id: number): number {
  return id === UNSET_ID ? -1 : id;
}

function nativeStat(stat: FuseStat): object {
  // fuse-native encodes times as whole milliseconds.
  return {
    ...stat,
    atime: Math.floor(stat.atimeMs),
    mtime: Math.floor(stat.mtimeMs),
    ctime: Math.floor(stat.ctimeMs),
  };
}

/** fuse-native sends statvfs as uint32 fields: grow the block unit until counts fit. */
function nativeStatfs(statfs: FuseStatfs): object {
  let scale = 1;
  while (statfs.blocks / scale >= UINT32_LIMIT) scale *= 2;
  const blocks = (count: number) => Math.floor(count / scale);
  const files = (count: number) => Math.min(count, UINT32_LIMIT - 1);
  return {
    bsize: statfs.bsize,
    frsize: statfs.bsize * scale,
    blocks: blocks(statfs.blocks),
    bfree: blocks(statfs.bfree),
    bavail: blocks(statfs.bavail),
    files: files(statfs.files),
    ffree: files(statfs.ffree),
    favail: files(statfs.ffree),
    namemax: statfs.namemax,
  };
}

// fuse-native.c passes utimens the atime twice: its dispatcher writes l->atime
// into both argument slots. The true mtime still sits in that thread's
// fuse_thread_locals_t, which reaches each handler as its first argument (a
// Buffer over the struct). These are the struct's offsets on linux-x64.
const OP_UTIMENS = 12;
const LOCALS_OP = 8;
const LOCALS_ATIME = 104;
const LOCALS_MTIME = 112;

function recoverUtimensMtime(fuse: NativeFuse): void {
  const handler = fuse._handlers[OP_UTIMENS];
  if (typeof handler !== 'function') throw new Error('fuse-native: no utimens handler to patch');
  fuse._handlers[OP_UTIMENS] = (locals: Buffer, op: number, ...args: unknown[]) => {
    const [path, atimeLow, atimeHigh] = args as [string, number, number];
    const mtime = storedMtime(locals, atimeLow + atimeHigh * UINT32_LIMIT);
    handler(locals, op, path, atimeLow, atimeHigh, mtime % UINT32_LIMIT, Math.floor(mtime / UINT32_LIMIT));
  };
}

/** The mtime in the locals struct, or NaN unless its layout is the one expected. */
function storedMtime(locals: Buffer, atime: number): number {
  const layoutHolds =
    locals.length >= LOCALS_MTIME + 8 &&
    locals.readUInt32LE(LOCALS_OP) === OP_UTIMENS &&
    Number(locals.readBigUInt64LE(LOCALS_ATIME)) === atime;
  return layoutHolds ? Number(locals.readBigUInt64LE(LOCALS_MTIME)) : NaN;
}

function unrecoveredMtime(): Promise<never> {
  return Promise.reject(new FuseError('ENOTSUP', 'utimens: fuse-native lost the mtime'));
}
