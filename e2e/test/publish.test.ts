// `make publish` against real registries (Debian's docker-registry) on
// loopback: one that speaks plain HTTP, as the cluster test's would without
// its CA, and one that speaks TLS and wants a login, as a user's does. What it
// pushes is read back with skopeo and helm: the three images at the version,
// and a chart whose version, appVersion and images are exactly those.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";
import { freePort } from "../src/driver";
import { type Registry, startRegistry } from "../src/registry";

const ROOT = path.join(__dirname, "..", "..", "..");
const HELM = path.join(ROOT, ".cache", "bin", "helm");
const SERVICES = ["csi-frontend", "mount-owner", "git-worker"];
/** The builder's store, and the version `make images` names its images by default (Chart.yaml's appVersion). */
const STORE = path.join(ROOT, ".cache", "containers");
const VERSION = /^appVersion: "?([^"\n]+)"?$/m.exec(readFileSync(path.join(ROOT, "charts", "git-csi", "Chart.yaml"), "utf8"))![1]!;
const run = promisify(execFile);

let dir: string;
const registries: Registry[] = [];

before(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-publish-"));
});

after(async () => {
  for (const registry of registries) await registry.process.stop();
  await fs.rm(dir, { recursive: true, force: true });
});

/** `make publish` as a user runs it; its exit code and output, whatever the code. */
async function publish(vars: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; output: string }> {
  try {
    const { stdout, stderr } = await run("make", ["-C", ROOT, "--no-print-directory", "publish", "BASES=local", ...vars], { env, maxBuffer: 16 << 20 });
    return { code: 0, output: stdout + stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, output: e.stdout + e.stderr };
  }
}

/** The images the packaged chart at oci://<registry>/charts/git-csi names, as helm renders it. */
async function chartImages(registry: string, version: string, flags: string[], env: NodeJS.ProcessEnv): Promise<{ chart: string; images: string[] }> {
  const chart = (await run(HELM, ["show", "chart", `oci://${registry}/charts/git-csi`, "--version", version, ...flags], { env })).stdout;
  const rendered = (await run(HELM, ["template", "git-csi", `oci://${registry}/charts/git-csi`, "--version", version, "--kube-version", "v1.34.0", ...flags], { env, maxBuffer: 16 << 20 })).stdout;
  const images = [...new Set([...rendered.matchAll(/image: (\S+)/g)].map((m) => m[1]!))].filter((i) => i.includes("/git-csi/"));
  return { chart, images: images.sort() };
}

async function assertPublished(registry: string, version: string, skopeo: string[], helm: string[], env: NodeJS.ProcessEnv): Promise<void> {
  for (const service of SERVICES) {
    const inspected = JSON.parse((await run("skopeo", ["inspect", ...skopeo, "--config", `docker://${registry}/git-csi/${service}:${version}`], { env })).stdout) as {
      config: { Entrypoint: string[] };
    };
    assert.ok(inspected.config.Entrypoint.includes("/app/dist/src/main.js"), `${service}: ${JSON.stringify(inspected.config)}`);
  }
  const { chart, images } = await chartImages(registry, version, helm, env);
  assert.match(chart, new RegExp(`^version: ${version}$`, "m"));
  assert.match(chart, new RegExp(`^appVersion: ${version}$`, "m"));
  assert.deepEqual(images, SERVICES.map((s) => `${registry}/git-csi/${s}:${version}`).sort());
}

test("make publish PLAIN_HTTP=1: the images and a chart naming exactly them, on a plain-HTTP registry", { timeout: 20 * 60_000 }, async () => {
  const address = `127.0.0.1:${await freePort()}`;
  registries.push(await startRegistry(path.join(dir, "plain"), { address, plainHttp: true }));
  const registry = `${address}/team`;
  const result = await publish([`REGISTRY=${registry}`, "VERSION=0.0.1-plain", "PLAIN_HTTP=1"], process.env);
  assert.equal(result.code, 0, result.output);
  await assertPublished(registry, "0.0.1-plain", ["--tls-verify=false"], ["--plain-http"], process.env);
});

test("make publish to a TLS registry that wants a login: refused without one, done with the usual auth file", { timeout: 20 * 60_000 }, async () => {
  const address = `127.0.0.1:${await freePort()}`;
  const htpasswd = path.join(dir, "htpasswd");
  await fs.writeFile(htpasswd, (await run("htpasswd", ["-Bbn", "publisher", "s3cret"])).stdout);
  const server = await startRegistry(path.join(dir, "tls"), { address, htpasswd });
  registries.push(server);
  const registry = `${address}/team`;
  // No auth file anywhere the script looks.
  const env = { ...server.env, HOME: path.join(dir, "home"), XDG_RUNTIME_DIR: path.join(dir, "run"), REGISTRY_AUTH_FILE: "" };
  const refused = await publish([`REGISTRY=${registry}`, "VERSION=0.0.1-tls"], env);
  assert.notEqual(refused.code, 0, refused.output);
  assert.match(refused.output, /unauthorized|authentication required/i);

  const authFile = path.join(dir, "auth.json");
  await run("skopeo", ["login", "--authfile", authFile, "-u", "publisher", "-p", "s3cret", address], { env });
  const done = await publish([`REGISTRY=${registry}`, "VERSION=0.0.1-tls"], { ...env, REGISTRY_AUTH_FILE: authFile });
  assert.equal(done.code, 0, done.output);
  await assertPublished(registry, "0.0.1-tls", ["--authfile", authFile], ["--registry-config", authFile], env);
});

test("the README's table of images says each one's user and entrypoint as `make images` built it", async () => {
  const readme = await fs.readFile(path.join(ROOT, "README.md"), "utf8");
  for (const service of SERVICES) {
    const row = new RegExp(`^\\| \`git-csi/${service}\` \\| [^|]+ \\| \`([^\`]+)\`[^|]* \\| \`([^\`]+)\` \\|$`, "m").exec(readme);
    assert.ok(row, `README.md has a row for git-csi/${service}`);
    const inspected = JSON.parse((await run("skopeo", ["inspect", "--config", `containers-storage:[overlay@${STORE}/storage+${STORE}/run]ghcr.io/liken-sh/git-csi/${service}:${VERSION}`])).stdout) as {
      config: { User: string; Entrypoint: string[] };
    };
    assert.deepEqual([row[1], row[2]], [inspected.config.User, inspected.config.Entrypoint.join(" ")], service);
  }
});
