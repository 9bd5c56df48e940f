// Test helper: a real OCI registry (Debian's docker-registry, the CNCF
// distribution) inside the cluster's network namespace, serving TLS with a
// certificate of its own CA, as a user's own registry would. `make publish`
// pushes the driver's images and chart to it, and every node's containerd
// pulls from it, the public images the tests provide too: registry.k8s.io and
// docker.io are mirrored to it (containerd's hosts.toml), so a pod naming
// `registry.k8s.io/pause:3.10` or `busybox:1.36` pulls what `make
// base-images cluster-images` made here under that name. skopeo and helm
// trust the CA through SSL_CERT_FILE (registry.env).
//
//   const registry = await startRegistry(dir, netns);     // answers /v2/
//   await seedPublicImages(netns, registry, publicImageRefs());
//   await writeHostsConfig(certsDir, registry);            // containerd's config_path
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { promisify } from "node:util";
import { until, watched, type Watched } from "./kube";

const ROOT = path.join(__dirname, "..", "..", "..");
const run = promisify(execFile);

/** Where the registry listens, an address on the namespace's loopback. */
export const REGISTRY_ADDRESS = "10.97.0.200:5000";
/** The pause image the sandboxes run; `make cluster-images` makes it from Kubernetes' pause.c. */
export const PAUSE_IMAGE = "registry.k8s.io/pause:3.10";
/** The images the tests' application pods run, made by e2e/images/bases.sh. */
export const NODE_IMAGE = "docker.io/library/node:20-bookworm-slim";
export const BUSYBOX_IMAGE = "docker.io/library/busybox:1.36";
/** The public registries whose images the tests provide, mirrored to the test's registry. */
const MIRRORED = ["registry.k8s.io", "docker.io"];

/** The builder's store that `make images` and `make base-images` fill (the Makefile's IMAGE_STORE). */
const STORE = path.join(ROOT, ".cache", "containers");
const storeTransport = (ref: string) => `containers-storage:[overlay@${STORE}/storage+${STORE}/run]${ref}`;

export interface Registry {
  process: Watched;
  /** The CA its certificate is signed by; undefined when it speaks plain HTTP. */
  ca?: string;
  /** What a client of it needs in its environment: SSL_CERT_FILE, the CA. */
  env: NodeJS.ProcessEnv;
}

export interface RegistryOptions {
  /** host:port, an IP address. */
  address: string;
  /** The network namespace to run in; none for the machine's loopback. */
  netns?: string;
  /** Plain HTTP instead of TLS. */
  plainHttp?: boolean;
  /** An htpasswd file (bcrypt): every request then needs one of its logins. */
  htpasswd?: string;
}

/** Starts a registry, its blobs and certificate under dir; resolves once /v2/ answers. */
export async function startRegistry(dir: string, options: RegistryOptions): Promise<Registry> {
  await fs.mkdir(path.join(dir, "data"), { recursive: true });
  const tls = options.plainHttp ? undefined : await certificate(dir, options.address.split(":")[0]!);
  const config = path.join(dir, "config.yml");
  // JSON is YAML.
  await fs.writeFile(
    config,
    JSON.stringify({
      version: 0.1,
      log: { level: "warn" },
      storage: { filesystem: { rootdirectory: path.join(dir, "data") }, delete: { enabled: true } },
      http: { addr: options.address, ...(tls && { tls: { certificate: tls.cert, key: tls.key } }) },
      ...(options.htpasswd && { auth: { htpasswd: { realm: "git-csi-e2e", path: options.htpasswd } } }),
    }),
  );
  const netns = options.netns;
  const registry = await watched("nsenter", [...(netns ? [`--net=/run/netns/${netns}`] : []), "--", "docker-registry", "serve", config], path.join(dir, "registry.log"));
  // Any HTTP answer will do: with a login, /v2/ answers 401.
  const probe = ["-s", "-o", "/dev/null", "-w", "%{http_code}", ...(tls ? ["--cacert", tls.ca] : []), `${tls ? "https" : "http"}://${options.address}/v2/`];
  await until("the registry answers /v2/", registry, async () => /^[24]\d\d$/.test((await inNetns(netns, "curl", probe)).stdout), 30_000);
  return { process: registry, ca: tls?.ca, env: { ...process.env, ...(tls && { SSL_CERT_FILE: tls.ca }) } };
}

/** A CA and the registry's serving certificate for address, signed by it. */
async function certificate(dir: string, address: string): Promise<{ ca: string; cert: string; key: string }> {
  const f = (name: string) => path.join(dir, name);
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  await run("openssl", ["req", "-x509", ...ec, "-days", "2", "-subj", "/CN=git-csi-e2e-registry-ca", "-keyout", f("ca.key"), "-out", f("ca.crt")]);
  await run("openssl", ["req", ...ec, "-subj", `/CN=${address}`, "-keyout", f("registry.key"), "-out", f("registry.csr")]);
  await fs.writeFile(f("san.ext"), `subjectAltName=IP:${address}\n`);
  await run("openssl", ["x509", "-req", "-in", f("registry.csr"), "-CA", f("ca.crt"), "-CAkey", f("ca.key"), "-CAcreateserial", "-days", "2", "-extfile", f("san.ext"), "-out", f("registry.crt")]);
  return { ca: f("ca.crt"), cert: f("registry.crt"), key: f("registry.key") };
}

function inNetns(netns: string | undefined, file: string, args: string[], env?: NodeJS.ProcessEnv) {
  return run("nsenter", [...(netns ? [`--net=/run/netns/${netns}`] : []), "--", file, ...args], { maxBuffer: 16 << 20, env });
}

/** The test registry's name for a public reference: its path under the mirrored host. */
function mirrored(ref: string): string {
  const host = MIRRORED.find((h) => ref.startsWith(`${h}/`));
  if (!host) throw new Error(`${ref} is not under a mirrored registry (${MIRRORED.join(", ")})`);
  return `${REGISTRY_ADDRESS}/${ref.slice(host.length + 1)}`;
}

/** Copies each public image from the builder's store into the registry, under its mirrored name. */
export async function seedPublicImages(netns: string, registry: Registry, refs: string[]): Promise<void> {
  for (const ref of refs) {
    await inNetns(netns, "skopeo", ["copy", "--quiet", storeTransport(ref), `docker://${mirrored(ref)}`], registry.env).catch((err: Error) => {
      throw new Error(`${ref}: not in the builder's store (run 'make base-images cluster-images'): ${err.message}`);
    });
  }
}

/** The chart's controller sidecars (values.yaml), whose images `make cluster-images` makes. */
export function chartSidecarRefs(): string[] {
  const values = readFileSync(path.join(ROOT, "charts", "git-csi", "values.yaml"), "utf8");
  return ["provisioner", "resizer", "snapshotter"].map((key) => {
    const block = new RegExp(`^  ${key}:\\n    repository: (\\S+)\\n    tag: "?([^"\\n]+)"?$`, "m").exec(values);
    if (!block) throw new Error(`charts/git-csi/values.yaml: no images.${key} repository and tag`);
    return `${block[1]}:${block[2]}`;
  });
}

/** Every public image the test cluster pulls. */
export function publicImageRefs(): string[] {
  return [PAUSE_IMAGE, ...chartSidecarRefs(), NODE_IMAGE, BUSYBOX_IMAGE];
}

/**
 * containerd's registry hosts (config_path): the test registry, trusted by
 * its CA, and each mirrored public registry served by it alone, so a pull
 * never leaves the namespace.
 */
export async function writeHostsConfig(certsDir: string, registry: Registry): Promise<void> {
  const local = `https://${REGISTRY_ADDRESS}`;
  const hosts = `server = "${local}"\n\n[host."${local}"]\n  capabilities = ["pull", "resolve"]\n  ca = "${registry.ca!}"\n`;
  for (const host of [REGISTRY_ADDRESS, ...MIRRORED]) {
    await fs.mkdir(path.join(certsDir, host), { recursive: true });
    await fs.writeFile(path.join(certsDir, host, "hosts.toml"), hosts);
  }
}
