// The one seam between the mount owner and a FUSE library. Everything above it
// speaks these types only, so a binding of our own can replace fuse-native.
import { constants } from 'node:os';

export type ErrnoCode = keyof typeof constants.errno;

/** Refuses a FUSE operation with the given errno. */
export class FuseError extends Error {
  readonly errno: number;

  constructor(readonly code: ErrnoCode, message: string = code) {
    super(message);
    this.name = 'FuseError';
    this.errno = constants.errno[code];
  }
}

/**
 * The positive errno a failed operation answers with: a FuseError's, a Node
 * system error's (whose errno is negative on Linux), else EIO.
 */
export function errnoOf(err: unknown): number {
  const errno = (err as { errno?: unknown } | null)?.errno;
  if (typeof errno === 'number' && errno !== 0) return Math.abs(errno);
  return constants.errno.EIO;
}

export interface FuseStat {
  mode: number;
  uid: number;
  gid: number;
  size: number;
  nlink: number;
  ino: number;
  dev: number;
  rdev: number;
  blksize: number;
  blocks: number;
  atimeMs: number;
  mtimeMs: number;
  ctimeMs: number;
}

/** Block counts are in units of bsize. */
export interface FuseStatfs {
  bsize: number;
  blocks: number;
  bfree: number;
  bavail: number;
  files: number;
  ffree: number;
  namemax: number;
}

/**
 * A file system as a set of async operations on absolute mount paths ("/a/b").
 * An operation fails by throwing an error that carries an errno (see errnoOf).
 * `fh` is the number returned by open or create.
 */
export interface FuseOperations {
  getattr(path: string): Promise<FuseStat>;
  /** Every entry, "." and ".." included. */
  readdir(path: string): Promise<string[]>;
  open(path: string, flags: number): Promise<number>;
  create(path: string, mode: number): Promise<number>;
  /** Fills `buffer` from `position`; resolves to the bytes read. */
  read(path: string, fh: number, buffer: Buffer, position: number): Promise<number>;
  /** Resolves to the bytes written. */
  write(path: string, fh: number, buffer: Buffer, position: number): Promise<number>;
  release(path: string, fh: number): Promise<void>;
  fsync(path: string, fh: number, datasync: boolean): Promise<void>;
  truncate(path: string, size: number): Promise<void>;
  ftruncate(path: string, fh: number, size: number): Promise<void>;
  unlink(path: string): Promise<void>;
  rename(from: string, to: string): Promise<void>;
  mkdir(path: string, mode: number): Promise<void>;
  rmdir(path: string): Promise<void>;
  symlink(target: string, path: string): Promise<void>;
  readlink(path: string): Promise<string>;
  link(existing: string, path: string): Promise<void>;
  chmod(path: string, mode: number): Promise<void>;
  /** -1 leaves that id unchanged. */
  chown(path: string, uid: number, gid: number): Promise<void>;
  utimens(path: string, atimeMs: number, mtimeMs: number): Promise<void>;
  statfs(path: string): Promise<FuseStatfs>;
}

export interface FuseMountOptions {
  mountpoint: string;
  ops: FuseOperations;
  /** Shown as the mount's source in /proc/self/mountinfo. */
  fsname: string;
}

export interface FuseMount {
  readonly mountpoint: string;
  unmount(): Promise<void>;
}

export interface FuseBinding {
  mount(opts: FuseMountOptions): Promise<FuseMount>;
}
