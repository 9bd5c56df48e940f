import * as fs from "node:fs/promises";
import * as path from "node:path";
import { orAbsent } from "@git-csi/config";
import { alreadyExists, describeAccessMode, failedPrecondition, gitcsi, internal, mountOwner, notFound } from "@git-csi/protos";

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
  /** The last snapshot or clone request the node pushed a flushed marker for: a restarted watch does not flush for it again. */
  flushedRequest?: string;
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

/** A directory of JSON records keyed by a volume id or name; a record it cannot read is an Internal error naming the file. */
class RecordDir<T> {
  constructor(private readonly dir: string) {}

  private file(key: string): string {
    return path.join(this.dir, `${key}.json`);
  }

  async get(key: string): Promise<T | undefined> {
    const file = this.file(key);
    const text = await orAbsent(fs.readFile(file, "utf8"));
    if (text === undefined) return undefined;
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw internal(`${file} is not a readable record (${(err as Error).message}); the node's state needs an operator`);
    }
  }

  put(key: string, record: T): Promise<void> {
    return writeFileAtomic(this.file(key), `${JSON.stringify(record, null, 2)}\n`);
  }

  /** Changes an existing record; none is left absent. */
  async update(key: string, change: (record: T) => T): Promise<T | undefined> {
    const record = await this.get(key);
    if (record === undefined) return undefined;
    const changed = change(record);
    await this.put(key, changed);
    return changed;
  }

  async remove(key: string): Promise<void> {
    await fs.rm(this.file(key), { force: true });
  }

  async keys(): Promise<string[]> {
    const names = (await orAbsent(fs.readdir(this.dir))) ?? [];
    return names.filter((n) => n.endsWith(".json")).map((n) => n.slice(0, -".json".length));
  }
}

/**
 * The mount owner's durable state: the node's volume records, the
 * controller's provisioned volumes, and deletions whose tree is still on the
 * node. Each change is a domain step; every error it raises carries the CSI
 * code the RPC answers with. Callers serialize steps per volume.
 */
export class State {
  private readonly volumes: RecordDir<VolumeRecord>;
  private readonly provisioned: RecordDir<mountOwner.Volume>;
  private readonly deletions: RecordDir<VolumeRecord>;
  private readonly snapshots: RecordDir<mountOwner.Snapshot>;

  constructor(readonly stateDir: string) {
    this.volumes = new RecordDir(path.join(stateDir, "volumes"));
    this.provisioned = new RecordDir(path.join(stateDir, "provisioned"));
    this.deletions = new RecordDir(path.join(stateDir, "deletions"));
    this.snapshots = new RecordDir(path.join(stateDir, "snapshots"));
  }

  /** The node's record of a volume; absent when the node never staged it. */
  volume(volumeId: string): Promise<VolumeRecord | undefined> {
    return this.volumes.get(volumeId);
  }

  volumeIds(): Promise<string[]> {
    return this.volumes.keys();
  }

  /** Durable before the mount serves: a restarted mount owner finds every mount it made. */
  recordStaged(record: VolumeRecord): Promise<void> {
    return this.volumes.put(record.volumeId, record);
  }

  /** FailedPrecondition while a pod still has the volume published. */
  async checkUnpublished(volumeId: string): Promise<VolumeRecord | undefined> {
    const record = await this.volumes.get(volumeId);
    if (record && record.targets.length > 0) throw failedPrecondition(`volume ${volumeId} is still published at ${record.targets.join(", ")}; unpublish it first`);
    return record;
  }

  async recordUnstaged(volumeId: string): Promise<void> {
    await this.volumes.update(volumeId, (record) => ({ ...record, stagingPath: undefined }));
  }

  /** The target and its pod join the record; a republish of the same target replaces its pod. */
  async recordPublished(volumeId: string, targetPath: string, pods: Record<string, gitcsi.Pod>): Promise<void> {
    await this.volumes.update(volumeId, (record) => ({ ...record, targets: [...record.targets.filter((t) => t !== targetPath), targetPath], pods }));
  }

  /** The target and its pod leave the record; the record as left, or absent where the target was not recorded. */
  async recordUnpublished(volumeId: string, targetPath: string): Promise<VolumeRecord | undefined> {
    const record = await this.volumes.get(volumeId);
    if (!record?.targets.includes(targetPath)) return undefined;
    const { [targetPath]: _gone, ...pods } = record.pods ?? {};
    const left = { ...record, targets: record.targets.filter((t) => t !== targetPath), pods };
    await this.volumes.put(volumeId, left);
    return left;
  }

  /** The class that arms the volume, and its claim where one is known. */
  async recordClass(volumeId: string, volumeClass: gitcsi.VolumeClass | undefined, claim?: gitcsi.Claim): Promise<void> {
    await this.volumes.update(volumeId, (record) => ({ ...record, volumeClass, claim: claim ?? record.claim }));
  }

  async recordFlushed(volumeId: string, request: string): Promise<void> {
    await this.volumes.update(volumeId, (record) => ({ ...record, flushedRequest: request }));
  }

  async recordReclaimPolicy(volumeId: string, reclaimPolicy: string): Promise<void> {
    const record = await this.volumes.get(volumeId);
    if (record && record.reclaimPolicy !== reclaimPolicy) await this.volumes.put(volumeId, { ...record, reclaimPolicy });
  }

  /**
   * A deleted volume leaves the node's records; its tree is recorded as
   * deleted first, so a git worker that does not answer now removes it when
   * it does. FailedPrecondition while the volume is staged. True when the
   * node had a record.
   */
  async recordDeleted(volumeId: string): Promise<boolean> {
    const record = await this.volumes.get(volumeId);
    if (record?.stagingPath !== undefined) throw failedPrecondition(`volume ${volumeId} is staged at ${record.stagingPath}; unstage it before deleting it`);
    if (record) {
      await this.deletions.put(volumeId, record);
      await this.volumes.remove(volumeId);
    }
    await this.provisioned.remove(volumeId);
    return record !== undefined;
  }

  /** A deleted volume whose tree is still on the node. */
  deletedVolume(volumeId: string): Promise<VolumeRecord | undefined> {
    return this.deletions.get(volumeId);
  }

  deletedVolumeIds(): Promise<string[]> {
    return this.deletions.keys();
  }

  /** The deleted volume's tree is gone. */
  forgetDeleted(volumeId: string): Promise<void> {
    return this.deletions.remove(volumeId);
  }

  /** CreateVolume's record: the same request again answers the same volume; another one under the name is AlreadyExists. */
  async createVolume(wanted: mountOwner.Volume): Promise<{ volume: mountOwner.Volume; created: boolean }> {
    const existing = await this.checkCreatable(wanted);
    if (existing) return { volume: existing, created: false };
    await this.provisioned.put(wanted.volumeId, wanted);
    return { volume: wanted, created: true };
  }

  /** The record a CreateVolume repeats, none for a new one; AlreadyExists when the name holds another volume. */
  async checkCreatable(wanted: mountOwner.Volume): Promise<mountOwner.Volume | undefined> {
    const stored = await this.provisioned.get(wanted.volumeId);
    // A record written before a field existed reads as that field's default.
    const existing = stored && mountOwner.Volume.fromPartial(stored);
    if (existing && JSON.stringify(mountOwner.Volume.toJSON(existing)) !== JSON.stringify(mountOwner.Volume.toJSON(mountOwner.Volume.fromPartial(wanted)))) {
      throw alreadyExists(`volume ${wanted.volumeId} exists with other capacity, parameters or access mode`);
    }
    return existing;
  }

  provisionedVolume(volumeId: string): Promise<mountOwner.Volume | undefined> {
    return this.provisioned.get(volumeId);
  }

  /**
   * A volume the Controller service may modify: one this mount owner
   * created, or, in standalone mode where the node is the controller, one
   * staged here (a static volume staged over the CSI socket). NotFound otherwise.
   */
  async knownVolume(volumeId: string): Promise<mountOwner.Volume> {
    const provisioned = await this.provisioned.get(volumeId);
    if (provisioned) return provisioned;
    const record = await this.volumes.get(volumeId);
    if (!record) throw notFound(`volume ${volumeId} does not exist: it was neither created nor staged here`);
    return {
      volumeId,
      name: volumeId,
      capacityBytes: 0,
      source: record.source,
      accessMode: record.accessMode,
      classParameters: record.volumeClass?.parameters ?? {},
      baseRef: "",
      onDelete: gitcsi.OnDelete.ON_DELETE_KEEP,
    };
  }

  /** The controller's record of a snapshot; absent when it made none under the id. */
  snapshot(snapshotId: string): Promise<mountOwner.Snapshot | undefined> {
    return this.snapshots.get(snapshotId);
  }

  /** Every snapshot recorded, by id. */
  async allSnapshots(): Promise<mountOwner.Snapshot[]> {
    const ids = (await this.snapshots.keys()).sort();
    return (await Promise.all(ids.map((id) => this.snapshots.get(id)))).filter((s) => s !== undefined);
  }

  recordSnapshot(snapshot: mountOwner.Snapshot): Promise<void> {
    return this.snapshots.put(snapshot.snapshotId, snapshot);
  }

  forgetSnapshot(snapshotId: string): Promise<void> {
    return this.snapshots.remove(snapshotId);
  }

  async recordProvisionedClass(volumeId: string, classParameters: Record<string, string>): Promise<void> {
    await this.provisioned.update(volumeId, (volume) => ({ ...volume, classParameters }));
  }
}

/** AlreadyExists: a volume's access mode never changes on a node. */
export function checkMode(record: VolumeRecord, accessMode: gitcsi.AccessMode): void {
  if (record.accessMode !== accessMode) {
    throw alreadyExists(`volume ${record.volumeId} is ${describeAccessMode(record.accessMode)}; its access mode cannot change to ${describeAccessMode(accessMode)}`);
  }
}

/** AlreadyExists: a volume id names one remote, one ref and one access mode on a node. */
export function checkIdentity(record: VolumeRecord, source: gitcsi.VolumeSource, accessMode: gitcsi.AccessMode): void {
  checkMode(record, accessMode);
  if (record.source.url !== source.url || record.source.ref !== source.ref) {
    throw alreadyExists(`volume ${record.volumeId} follows ${record.source.url} ref ${record.source.ref} on this node, not ${source.url} ref ${source.ref}`);
  }
}

/**
 * One staged tree has one group: a pod asking another fsGroup of an RWO volume
 * staged for the first pod's is refused, since regrouping the tree under a
 * running pod would take its access away. A pod without an fsGroup publishes.
 */
export function checkGroup(record: VolumeRecord, group: string): void {
  if (group === "" || group === record.volumeMountGroup) return;
  const staged = record.volumeMountGroup ? `volume_mount_group ${record.volumeMountGroup}` : "no volume_mount_group";
  throw failedPrecondition(`volume ${record.volumeId} is staged on this node with ${staged}; a pod with fsGroup ${group} cannot share it until the volume is unstaged`);
}
