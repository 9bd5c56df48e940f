import type { CoreV1Api, KubeConfig } from "@kubernetes/client-node" with { "resolution-mode": "import" };
import { clientNode } from "./client";
import { describeError, httpStatus } from "./watched";

/** A pod publishing a volume, as the kubelet's pod info names it. */
export interface PodRef {
  namespace: string;
  name: string;
  uid: string;
}

/**
 * What became of one pod of a fenced mount: deleted (its controller starts it
 * again), left because nothing would start it again, already gone, or not
 * known because the API server failed, which is never "nothing to do".
 */
export type FencedPod =
  { pod: PodRef; outcome: "deleted"; controller: string } | { pod: PodRef; outcome: "uncontrolled" } | { pod: PodRef; outcome: "gone" } | { pod: PodRef; outcome: "failed"; error: string };

/**
 * Deletes the pods of a fenced mount that a controller owns, so each starts
 * again on a new stage. A pod without a controller is left: deleting it
 * would lose it for good. Never throws: a failure is an outcome.
 */
export class FencedPodDeleter {
  private api: Promise<CoreV1Api> | undefined;

  constructor(private readonly kubeConfig: KubeConfig) {}

  async deleteIfControlled(pod: PodRef): Promise<FencedPod> {
    try {
      const api = await (this.api ??= clientNode().then((client) => this.kubeConfig.makeApiClient(client.CoreV1Api)));
      const current = await api.readNamespacedPod({ namespace: pod.namespace, name: pod.name });
      // Another pod took the name since: it is not the one on the fenced mount.
      if (pod.uid && current.metadata?.uid !== pod.uid) return { pod, outcome: "gone" };
      const owner = current.metadata?.ownerReferences?.find((o) => o.controller);
      if (!owner) return { pod, outcome: "uncontrolled" };
      const uid = pod.uid || current.metadata?.uid;
      // The uid precondition: a pod that replaced this one under the same name is never deleted.
      await api.deleteNamespacedPod({ namespace: pod.namespace, name: pod.name, body: { preconditions: uid ? { uid } : undefined } });
      return { pod, outcome: "deleted", controller: `${owner.kind}/${owner.name}` };
    } catch (err) {
      const code = httpStatus(err);
      // 404: gone already; 409: the uid precondition failed, another pod has the name.
      if (code === 404 || code === 409) return { pod, outcome: "gone" };
      return { pod, outcome: "failed", error: describeError(err) };
    }
  }
}
