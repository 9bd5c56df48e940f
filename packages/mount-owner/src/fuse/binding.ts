// The mount owner's FUSE server: a native addon (../../native) on libfuse3's
// low-level API whose worker threads serve every operation on the backing
// tree by descriptor. JavaScript only mounts, unmounts, moves the lease's end
// and fences; no JavaScript runs per operation, so this process may itself
// use the mount without deadlocking. A mount's connection can be kept by the
// descriptor keeper and resumed by the next mount owner (../handover.ts).
import { join } from "node:path";

type NativeHandle = { readonly __brand: "gitcsi_fuse volume" };

interface NativeAddon {
  mount(mountpoint: string, backing: string, fsname: string, serveUntilMs: number, onFenced: (refused: number) => void): NativeHandle;
  unmount(handle: NativeHandle): void;
  serveUntil(handle: NativeHandle, ms: number): void;
  fence(handle: NativeHandle): void;
  invalidate(handle: NativeHandle): void;
  syncMount(handle: NativeHandle): Promise<boolean>;
  resume(mountpoint: string, backing: string, fsname: string, serveUntilMs: number, onFenced: (refused: number) => void, fd: number, init: Buffer): NativeHandle;
  keep(handle: NativeHandle, socketPath: string, key: string): void;
  take(socketPath: string): KeptConnection[];
  quiesce(handle: NativeHandle): void;
  setIncarnation(incarnation: number): void;
  clockMs(): number;
  switchRoot(handle: NativeHandle, backing: string): void;
}

/** A FUSE connection the keeper holds: its /dev/fuse descriptor (now this process's too) and the kernel's INIT of it. */
export interface KeptConnection {
  key: string;
  fd: number;
  init: Buffer;
}

// Built by `make build` into the package's dist (see native/Makefile).
const addon = require(join(__dirname, "../../native/gitcsi_fuse.node")) as NativeAddon;

/**
 * The clock a mount's serving time is kept on, in ms (CLOCK_BOOTTIME, as the
 * server's own check reads it): a wall clock step moves no deadline.
 */
export function servingClock(): number {
  return addon.clockMs();
}

export interface EpochFence {
  /** Until when the mount may serve, on servingClock(); Infinity for always. */
  serveUntilMs: number;
  /**
   * The server fenced the mount (its lease ran out) or refused more
   * operations since: `refused` of them. Called on the main thread.
   */
  onFenced(refused: number): void;
}

export interface FuseMountOptions {
  mountpoint: string;
  /** The directory the mount serves. */
  backing: string;
  /** Shown as the mount's source in /proc/self/mountinfo. */
  fsname: string;
  epoch?: EpochFence;
}

export interface FuseMount {
  readonly mountpoint: string;
  /** Unmounts; the session ends when no bind of the mount is left. */
  unmount(): Promise<void>;
  /** A renewal moved the lease's end. */
  serveUntil(ms: number): void;
  /**
   * From now on every operation answers EIO and the kernel's cached pages,
   * attributes and entries of the mount are dropped. For good.
   */
  fence(): void;
  /**
   * The kernel's dirty pages of the mount reach the backing tree (syncfs).
   * False when it is no longer mounted: the unmount sent them.
   */
  sync(): Promise<boolean>;
  /** The kernel forgets the entries and attributes it cached: the tree moved behind the mount. */
  invalidate(): void;
  /**
   * Serves backing from now on, in one step at the root (native/root.c): a
   * file open keeps reading the old tree; the kernel caches no entry any more.
   */
  switchRoot(backing: string): void;
  /** The keeper at socketPath holds the connection from now on too, under key. */
  keep(socketPath: string, key: string): void;
  /** No request is taken any more and every one taken is answered: the next mount owner serves the rest. */
  quiesce(): void;
}

export function mountFuse(opts: FuseMountOptions): FuseMount {
  const epoch = opts.epoch ?? { serveUntilMs: Infinity, onFenced: () => undefined };
  return wrap(addon.mount(opts.mountpoint, opts.backing, opts.fsname, epoch.serveUntilMs, epoch.onFenced), opts);
}

/** Serves a kept connection again: the kernel's mount and every open file on it carry on. */
export function resumeFuse(opts: FuseMountOptions, kept: KeptConnection): FuseMount {
  const epoch = opts.epoch ?? { serveUntilMs: Infinity, onFenced: () => undefined };
  return wrap(addon.resume(opts.mountpoint, opts.backing, opts.fsname, epoch.serveUntilMs, epoch.onFenced, kept.fd, kept.init), opts);
}

/** The connections the keeper at socketPath holds. */
export function takeKept(socketPath: string): KeptConnection[] {
  return addon.take(socketPath);
}

/** File handles name the mount owner that opened them: this one is unlike every earlier one. */
export function setIncarnation(incarnation: number): void {
  addon.setIncarnation(incarnation);
}

// The server fences by itself at the lease's end (native/deadline.c) and tells onFenced.
function wrap(handle: NativeHandle, opts: FuseMountOptions): FuseMount {
  let mounted = true;
  return {
    mountpoint: opts.mountpoint,
    unmount: async () => {
      if (mounted) addon.unmount(handle);
      mounted = false;
    },
    serveUntil: (ms) => {
      if (mounted) addon.serveUntil(handle, ms);
    },
    fence: () => {
      if (mounted) addon.fence(handle);
    },
    sync: () => (mounted ? addon.syncMount(handle) : Promise.resolve(false)),
    invalidate: () => {
      if (mounted) addon.invalidate(handle);
    },
    switchRoot: (backing) => {
      if (mounted) addon.switchRoot(handle, backing);
    },
    keep: (socketPath, key) => addon.keep(handle, socketPath, key),
    quiesce: () => addon.quiesce(handle),
  };
}
