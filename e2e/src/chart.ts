// The chart as helm renders it, for tests: the pinned helm that `make
// go-tools` builds into .cache/bin, for the Kubernetes version the tests run.
import { existsSync } from "node:fs";
import * as path from "node:path";
import { run } from "./driver";
import { kubeVersions } from "./kube";

const ROOT = path.join(__dirname, "..", "..", "..");
export const HELM = path.join(ROOT, ".cache", "bin", "helm");

/** Why helm cannot run here, or undefined when it can. */
export function helmMissing(): string | undefined {
  return existsSync(HELM) ? undefined : "no helm in .cache/bin: run 'make go-tools'";
}

/** `helm template` of charts/git-csi as release git-csi in the namespace, with more flags. */
export async function helmTemplate(namespace: string, flags: string[] = []): Promise<string> {
  const chart = path.join(ROOT, "charts", "git-csi");
  return (await run(HELM, ["template", "git-csi", chart, "--namespace", namespace, "--kube-version", kubeVersions().kubernetes, ...flags], { maxBuffer: 16 << 20 })).stdout;
}
