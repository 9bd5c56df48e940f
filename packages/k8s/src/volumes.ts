import type { KubeConfig, V1PersistentVolume } from "@kubernetes/client-node" with { "resolution-mode": "import" };
import { DRIVER_NAME } from "@git-csi/config";
import { clientNode, loadKubeConfig } from "./client";

/**
 * The API server a node or controller service talks to: the `--kubeconfig`
 * file when given, else the pod's service account in a cluster, else none:
 * outside a cluster (standalone) the driver runs without Kubernetes, and never
 * picks up a person's ~/.kube/config by surprise.
 */
export async function kubeConfigIfAny(kubeconfig: string): Promise<KubeConfig | undefined> {
  if (kubeconfig) return loadKubeConfig({ kubeconfig });
  if (process.env.KUBERNETES_SERVICE_HOST && process.env.KUBERNETES_SERVICE_PORT) return loadKubeConfig();
  return undefined;
}

/** What a PersistentVolume of this driver says of the volume it holds. */
export interface PersistentVolumeInfo {
  name: string;
  accessModes: string[];
}

/**
 * The PersistentVolume of this driver with that volumeHandle, if one exists:
 * a static volume, or one whose controller record was lost, is known by it.
 */
export async function findPersistentVolume(kubeConfig: KubeConfig, volumeHandle: string): Promise<PersistentVolumeInfo | undefined> {
  const found = await findOurs(kubeConfig, volumeHandle);
  return found && { name: found.metadata?.name ?? "", accessModes: found.spec?.accessModes ?? [] };
}

async function findOurs(kubeConfig: KubeConfig, volumeHandle: string): Promise<V1PersistentVolume | undefined> {
  const { CoreV1Api } = await clientNode();
  const api = kubeConfig.makeApiClient(CoreV1Api);
  for (let _continue: string | undefined; ;) {
    const page = await api.listPersistentVolume({ limit: 500, _continue });
    const found = page.items.find((pv) => pv.spec?.csi?.driver === DRIVER_NAME && pv.spec.csi.volumeHandle === volumeHandle);
    if (found) return found;
    _continue = page.metadata?._continue;
    if (!_continue) return undefined;
  }
}

/**
 * The annotation by which the controller asks the node serving a volume to
 * flush for a snapshot or a clone (its value: the snapshot's id or the
 * clone's volume id): the controller cannot reach a node's sockets, and
 * every node watches the PersistentVolumes already.
 */
export const SNAPSHOT_REQUEST_ANNOTATION = "git.liken.sh/snapshot-request";

/**
 * Asks the node serving the volume to flush for the request: the
 * PersistentVolume's annotation names it. The PersistentVolume's name, or
 * undefined when no PersistentVolume names the volume. An annotation that
 * names the request already is left as it is, so a retry patches nothing.
 */
export async function requestFlush(kubeConfig: KubeConfig, volumeHandle: string, request: string): Promise<string | undefined> {
  const pv = await findOurs(kubeConfig, volumeHandle);
  const name = pv?.metadata?.name;
  if (!name || pv.metadata?.annotations?.[SNAPSHOT_REQUEST_ANNOTATION] === request) return name;
  // Only the one annotation: the others are other controllers'.
  const add = pv.metadata?.annotations ? { path: ANNOTATION_PATH, value: request } : { path: "/metadata/annotations", value: { [SNAPSHOT_REQUEST_ANNOTATION]: request } };
  await patchPersistentVolume(kubeConfig, name, [{ op: "add", ...add }]);
  return name;
}

/**
 * The request is served: its annotation goes, only while it still names
 * this request (a JSON patch's test, so another request set meanwhile stays).
 */
export async function clearFlushRequest(kubeConfig: KubeConfig, volumeHandle: string, request: string): Promise<void> {
  const pv = await findOurs(kubeConfig, volumeHandle);
  const name = pv?.metadata?.name;
  if (!name || pv.metadata?.annotations?.[SNAPSHOT_REQUEST_ANNOTATION] !== request) return;
  await patchPersistentVolume(kubeConfig, name, [
    { op: "test", path: ANNOTATION_PATH, value: request },
    { op: "remove", path: ANNOTATION_PATH },
  ]);
}

/** The annotation as a JSON patch path: "/" in a key is written "~1". */
const ANNOTATION_PATH = `/metadata/annotations/${SNAPSHOT_REQUEST_ANNOTATION.replace("/", "~1")}`;

/** A JSON patch, client-node's default for a patch. */
async function patchPersistentVolume(kubeConfig: KubeConfig, name: string, patch: object[]): Promise<void> {
  const { CoreV1Api } = await clientNode();
  await kubeConfig.makeApiClient(CoreV1Api).patchPersistentVolume({ name, body: patch });
}

export type { KubeConfig } from "@kubernetes/client-node" with { "resolution-mode": "import" };
