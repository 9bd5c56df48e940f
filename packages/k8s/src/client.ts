import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { KubeConfig } from "@kubernetes/client-node" with { "resolution-mode": "import" };

export type ClientNode = typeof import("@kubernetes/client-node", { with: { "resolution-mode": "import" } });

let loading: Promise<ClientNode> | undefined;

/**
 * @kubernetes/client-node is an ECMAScript module from 1.0 on, and TypeScript's node16
 * mode refuses a static import of one from CommonJS; a dynamic import works on every Node 20.
 */
export function clientNode(): Promise<ClientNode> {
  return (loading ??= import("@kubernetes/client-node"));
}

const SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/**
 * The API server to talk to: the `--kubeconfig` file when given, else the pod's service
 * account when running in a cluster, else KUBECONFIG or ~/.kube/config.
 * client-node's own fallback (http://localhost:8080) is refused: it hides a missing configuration.
 */
export async function loadKubeConfig(options: { kubeconfig?: string } = {}): Promise<KubeConfig> {
  const { KubeConfig } = await clientNode();
  const config = new KubeConfig();
  if (options.kubeconfig) {
    readable(options.kubeconfig, "--kubeconfig");
    config.loadFromFile(options.kubeconfig);
    return withCluster(config, `--kubeconfig ${options.kubeconfig}`);
  }
  const { KUBERNETES_SERVICE_HOST: host, KUBERNETES_SERVICE_PORT: port, KUBECONFIG: kubeconfigEnv } = process.env;
  if (host && port) {
    readable(SERVICE_ACCOUNT_TOKEN, "in a cluster (KUBERNETES_SERVICE_HOST is set), the service account token");
    config.loadFromCluster();
    return config;
  }
  const homeConfig = path.join(os.homedir(), ".kube", "config");
  if (kubeconfigEnv || fs.existsSync(homeConfig)) {
    const source = kubeconfigEnv ? `KUBECONFIG=${kubeconfigEnv}` : homeConfig;
    try {
      config.loadFromDefault();
    } catch (err) {
      throw new Error(`${source}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    return withCluster(config, source);
  }
  throw new Error(
    `no Kubernetes API server configured: --kubeconfig was not given, KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT ` +
      `are not both set (not in a pod), KUBECONFIG is unset and ${homeConfig} does not exist`,
  );
}

function readable(file: string, what: string): void {
  try {
    fs.accessSync(file, fs.constants.R_OK);
  } catch (err) {
    throw new Error(`${what} ${file} cannot be read: ${(err as NodeJS.ErrnoException).code ?? String(err)}`, { cause: err });
  }
}

function withCluster(config: KubeConfig, source: string): KubeConfig {
  if (!config.getCurrentCluster()) throw new Error(`${source} names no cluster for its current context "${config.getCurrentContext()}"`);
  return config;
}
