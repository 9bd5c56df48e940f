import * as fs from "node:fs/promises";
import * as path from "node:path";
import { orAbsent } from "@git-csi/config";
import type { gitcsi, mountOwner } from "@git-csi/protos";

/**
 * What the node knows of one volume, kept under the state dir so that a
 * restarted mount owner can finish an unpublish or unstage it did not start.
 * It holds identities and paths only, never a credential.
 */
export interface VolumeRecord {
  volumeId: string;
  source: gitcsi.VolumeSource;
  accessMode: gitcsi.AccessMode;
  /** The backing work tree the git worker prepared. */
  treePath?: string;
  /** Set while the volume is staged. */
  stagingPath?: string;
  /** Publish targets bind-mounted from the staging path. */
  targets: string[];
  /** The class that arms the volume; none leaves it unarmed. */
  volumeClass?: gitcsi.VolumeClass;
  /** The stage carried a Secret. Whether, never which: the Secret itself stays in memory. */
  credentialExpected?: boolean;
  /** The generation of the volume's last mount session on this node (its .rwo-session record). */
  generation?: number;
  /** The claim bound to the volume, from the Kubernetes watch. */
  claim?: gitcsi.Claim;
  /** The PersistentVolume's reclaim policy, from the watch: a Delete volume deleted while the node was down goes when it starts. */
  reclaimPolicy?: string;
  /** The fsGroup (volume_mount_group) the stage applied to the tree; absent for none. */
  volumeMountGroup?: string;
  /** The pod each publish target serves (podInfoOnMount), whose events the volume posts. */
  pods?: Record<string, gitcsi.Pod>;
}

/** Writes a file so that a crash leaves either the old or the new content: temp, fsync, rename, fsync the directory. */
export async function writeFileAtomic(file: string, content: string, mode = 0o600): Promise<void> {
  const dir = path.dirname(file);
  await fs.mkdir(dir, { recursive: true });
  const temp = path.join(dir, `.${path.basename(file)}.${process.pid}.tmp`);
  const handle = await fs.open(temp, "w", mode);
  try {
    await handle.writeFile(content);
    await handle.sync();
  } finally {
    await handle.close();
  }
  await fs.rename(temp, file);
  const dirHandle = await fs.open(dir, "r");
  try {
    await dirHandle.sync();
  } finally {
    await dirHandle.close();
  }
}

async function readJson<T>(file: string): Promise<T | undefined> {
  const text = await orAbsent(fs.readFile(file, "utf8"));
  return text === undefined ? undefined : (JSON.parse(text) as T);
}

/** A directory of JSON records keyed by a volume id or name. */
class RecordDir<T> {
  constructor(private readonly dir: string) {}

  private file(key: string): string {
    return path.join(this.dir, `${key}.json`);
  }

  get(key: string): Promise<T | undefined> {
    return readJson<T>(this.file(key));
  }

  put(key: string, record: T): Promise<void> {
    return writeFileAtomic(this.file(key), `${JSON.stringify(record, null, 2)}\n`);
  }

  async remove(key: string): Promise<void> {
    await fs.rm(this.file(key), { force: true });
  }

  async keys(): Promise<string[]> {
    const names = (await orAbsent(fs.readdir(this.dir))) ?? [];
    return names.filter((n) => n.endsWith(".json")).map((n) => n.slice(0, -".json".length));
  }
}

export class State {
  /** The node's volume records. */
  readonly volumes: RecordDir<VolumeRecord>;
  /** The controller's record of provisioned volumes, keyed by name. */
  readonly provisioned: RecordDir<mountOwner.Volume>;
  /** Volumes deleted with reclaim policy Delete whose tree is still on the node: the git worker did not answer. */
  readonly deletions: RecordDir<VolumeRecord>;

  constructor(readonly stateDir: string) {
    this.volumes = new RecordDir(path.join(stateDir, "volumes"));
    this.provisioned = new RecordDir(path.join(stateDir, "provisioned"));
    this.deletions = new RecordDir(path.join(stateDir, "deletions"));
  }
}
