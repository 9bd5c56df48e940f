import type { KubeConfig } from "@kubernetes/client-node" with { "resolution-mode": "import" };
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
  const { CoreV1Api } = await clientNode();
  const api = kubeConfig.makeApiClient(CoreV1Api);
  for (let _continue: string | undefined; ;) {
    const page = await api.listPersistentVolume({ limit: 500, _continue });
    const found = page.items.find((pv) => pv.spec?.csi?.driver === DRIVER_NAME && pv.spec.csi.volumeHandle === volumeHandle);
    if (found) return { name: found.metadata?.name ?? "", accessModes: found.spec?.accessModes ?? [] };
    _continue = page.metadata?._continue;
    if (!_continue) return undefined;
  }
}

export type { KubeConfig } from "@kubernetes/client-node" with { "resolution-mode": "import" };
