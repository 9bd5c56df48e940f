// FuseOperations serving one backing directory (a volume's git work tree).
// Only async fs calls: this process also serves the mount, and a synchronous
// call that reached it would block the loop its own FUSE callbacks need.
import { constants as fsc, promises as fsp, type Stats, type StatsFs } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import type { FuseOperations, FuseStat, FuseStatfs } from './binding';
import { FuseError } from './binding';

const { O_CREAT, O_NOFOLLOW, O_NONBLOCK, O_RDONLY, O_RDWR, O_WRONLY } = fsc;
const MODE_BITS = 0o7777;
const S_ISGID = 0o2000;
const NAME_MAX = 255;

export interface PassthroughOptions {
  /**
   * Runs before each operation with its name and mount path (for release,
   * after the handle is closed, so a refusal leaks no descriptor). Throwing refuses the operation with the error's errno (see errnoOf):
   * a FuseError's, else EIO for an error that carries none.
   */
  beforeOperation?: (op: string, path: string) => void;
}

export function createPassthrough(root: string, options: PassthroughOptions = {}): FuseOperations {
  const backing = resolve(root);
  const handles = new Map<number, FileHandle>();
  const beforeOperation = options.beforeOperation ?? (() => undefined);
  const ownUid = process.getuid?.() ?? 0;
  const ownGid = process.getgid?.() ?? 0;

  /** Runs the hook, then maps a mount path onto the backing tree. */
  function enter(op: string, path: string): string {
    beforeOperation(op, path);
    return backingPath(backing, path);
  }

  function handle(fh: number): FileHandle {
    const found = handles.get(fh);
    if (!found) throw new FuseError('EBADF');
    return found;
  }

  function register(opened: FileHandle): number {
    handles.set(opened.fd, opened);
    return opened.fd;
  }

  // fuse-native gives no caller credentials, so a new entry would belong to
  // this process (root). Taking the parent directory's owner instead makes an
  // app's files its own in a directory it owns.
  async function adoptParentOwner(file: string): Promise<Stats> {
    const parent = await fsp.lstat(dirname(file));
    if (parent.uid !== ownUid || parent.gid !== ownGid) await fsp.lchown(file, parent.uid, parent.gid);
    return parent;
  }

  return {
    async getattr(path) {
      return fuseStat(await fsp.lstat(enter('getattr', path)));
    },

    async readdir(path) {
      // fuse-native lists only what it is given; "." and ".." are ours to add.
      return ['.', '..', ...(await fsp.readdir(enter('readdir', path)))];
    },

    async open(path, flags) {
      return register(await fsp.open(enter('open', path), flags | O_NOFOLLOW));
    },

    async create(path, mode) {
      const file = enter('create', path);
      // fuse-native drops create's open flags; read-write serves any of them.
      const created = await fsp.open(file, O_CREAT | O_RDWR | O_NOFOLLOW, mode);
      try {
        await adoptParentOwner(file);
        // Our umask must not strip bits the app's (already applied) allowed.
        await created.chmod(mode & MODE_BITS);
      } catch (err) {
        await created.close();
        throw err;
      }
      return register(created);
    },

    async read(path, fh, buffer, position) {
      beforeOperation('read', path);
      return (await handle(fh).read(buffer, 0, buffer.length, position)).bytesRead;
    },

    async write(path, fh, buffer, position) {
      beforeOperation('write', path);
      return (await handle(fh).write(buffer, 0, buffer.length, position)).bytesWritten;
    },

    // Never refused: the backing descriptor must be closed whatever the epoch.
    async release(path, fh) {
      const released = handles.get(fh);
      handles.delete(fh);
      await released?.close();
      beforeOperation('release', path);
    },

    // No flush op: writes land on the backing file at once, so close() has
    // nothing to push, and once told ENOSYS the kernel stops sending FLUSH.

    async fsync(path, fh, datasync) {
      beforeOperation('fsync', path);
      await (datasync ? handle(fh).datasync() : handle(fh).sync());
    },

    async truncate(path, size) {
      await withNoFollow(enter('truncate', path), O_WRONLY, (file) => file.truncate(size));
    },

    async ftruncate(path, fh, size) {
      beforeOperation('ftruncate', path);
      await handle(fh).truncate(size);
    },

    async unlink(path) {
      await fsp.unlink(enter('unlink', path));
    },

    async rename(from, to) {
      await fsp.rename(enter('rename', from), enter('rename', to));
    },

    async mkdir(path, mode) {
      const dir = enter('mkdir', path);
      await fsp.mkdir(dir, mode);
      const parent = await adoptParentOwner(dir);
      // Keep the setgid bit the backing file system inherited from the parent.
      const wanted = (mode & MODE_BITS) | (parent.mode & S_ISGID);
      await withNoFollow(dir, O_RDONLY, (file) => file.chmod(wanted));
    },

    async rmdir(path) {
      await fsp.rmdir(enter('rmdir', path));
    },

    // The target is stored as given; the kernel resolves it against the mount.
    async symlink(target, path) {
      const link = enter('symlink', path);
      await fsp.symlink(target, link);
      await adoptParentOwner(link);
    },

    async readlink(path) {
      return fsp.readlink(enter('readlink', path));
    },

    async link(existing, path) {
      await fsp.link(enter('link', existing), enter('link', path));
    },

    async chmod(path, mode) {
      await withNoFollow(enter('chmod', path), O_RDONLY, (file) => file.chmod(mode & MODE_BITS));
    },

    async chown(path, uid, gid) {
      await fsp.lchown(enter('chown', path), uid, gid);
    },

    async utimens(path, atimeMs, mtimeMs) {
      await fsp.lutimes(enter('utimens', path), atimeMs / 1000, mtimeMs / 1000);
    },

    async statfs(path) {
      beforeOperation('statfs', path);
      return fuseStatfs(await fsp.statfs(backing));
    },
  };
}

/** The backing path of an absolute mount path; ".." can never climb out. */
function backingPath(backing: string, path: string): string {
  if (!path.startsWith('/') || path.includes('\0') || path.split('/').includes('..')) {
    throw new FuseError('EINVAL', `refused path ${JSON.stringify(path)}`);
  }
  return join(backing, path);
}

/**
 * Runs `use` on the entry itself, never a symlink's target (Linux has no
 * lchmod). O_NONBLOCK keeps a FIFO's open from waiting for a peer.
 */
async function withNoFollow(
  file: string,
  flags: number,
  use: (opened: FileHandle) => Promise<void>,
): Promise<void> {
  const opened = await fsp.open(file, flags | O_NOFOLLOW | O_NONBLOCK);
  try {
    await use(opened);
  } finally {
    await opened.close();
  }
}

function fuseStat(stats: Stats): FuseStat {
  return {
    mode: stats.mode,
    uid: stats.uid,
    gid: stats.gid,
    size: stats.size,
    nlink: stats.nlink,
    ino: stats.ino,
    dev: stats.dev,
    rdev: stats.rdev,
    blksize: stats.blksize,
    blocks: stats.blocks,
    atimeMs: stats.atimeMs,
    mtimeMs: stats.mtimeMs,
    ctimeMs: stats.ctimeMs,
  };
}

function fuseStatfs(statfs: StatsFs): FuseStatfs {
  const { bsize, blocks, bfree, bavail, files, ffree } = statfs;
  return { bsize, blocks, bfree, bavail, files, ffree, namemax: NAME_MAX };
}
