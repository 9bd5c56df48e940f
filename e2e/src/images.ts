// Test helper: the chart's images, made without a Docker daemon, a registry or
// a base-image pull, as OCI image archives that `ctr images import` loads.
//
// The Dockerfile at the root stays the published recipe, and this file reads
// it: each image's target stage (its base, apt-get install list, ENV,
// WORKDIR, USER and ENTRYPOINT) and the build stage's `pnpm deploy --filter`
// whose output the target copies to /app. An instruction it does not know
// fails the build, so the two cannot drift apart silently. What the
// Dockerfile pulls, this makes from local parts:
//
//   layer 1  the base (node:20-bookworm-slim): a Debian root filesystem made
//            of the files of the Debian packages installed on this machine
//            (base system, Node.js), as `make apt` installed them
//   layer 2  the target's apt-get install list, with its dependencies
//   layer 3  /app: `pnpm deploy --filter <package> --prod`, the built dist and
//            production node_modules, native addons (.node) included
//
// The sidecars and the pause image are one static Go or C binary each.
//
//   const recipe = recipeOf("mount-owner");
//   await buildImage(image(recipe, "ghcr.io/liken-sh/git-csi/mount-owner:e2e"), "/tmp/x/mount-owner.tar", "/tmp/x/work");
//   await importImage(containerdSocket, "/tmp/x/mount-owner.tar");
import { execFile, execFileSync } from "node:child_process";
import * as crypto from "node:crypto";
import { createReadStream, readFileSync } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { promisify } from "node:util";

const ROOT = path.join(__dirname, "..", "..", "..");
const run = promisify(execFile);

/** What a Dockerfile's target stage says, in the words this builder acts on. */
export interface Recipe {
  /** The Dockerfile target, which is also the package directory under packages/. */
  service: string;
  /** The workspace package `pnpm deploy --filter` deploys to /app. */
  deploy: string;
  base: string;
  packages: string[];
  env: Record<string, string>;
  workdir: string;
  user: string;
  entrypoint: string[];
}

/** The one base the Dockerfile's targets use, and the Debian packages that stand for it. */
const BASES: Record<string, string[]> = {
  // bookworm-slim's essential set that an image's programs use, and Node.js.
  "node:20-bookworm-slim": ["base-files", "base-passwd", "bash", "coreutils", "dash", "debianutils", "findutils", "grep", "gzip", "hostname", "libc-bin", "sed", "tar", "nodejs"],
};

/** Dependencies no image runs: python3 is there for node-gyp, which only the build stage would use. */
const OMITTED = new Set(["python3"]);

/**
 * Paths an image leaves out: documentation, as in a slim image, and the npm
 * and corepack Node.js ships (no image runs them; a global npm install may
 * have replaced their files here since).
 */
const SLIM = /^\/usr\/(share\/(doc|man|info|locale|lintian|bug)\/|lib\/node_modules\/|bin\/(npm|npx|corepack)$)/;

/** Reads the Dockerfile's target for a service. */
export function recipeOf(service: string): Recipe {
  const file = path.join(ROOT, "Dockerfile");
  return parseDockerfile(service, readFileSync(file, "utf8"), file);
}

/** A Dockerfile's stages by name (`FROM … AS name`), each its instructions, continuation lines joined, comments left out. */
function stagesOf(text: string, file: string): Map<string, string[]> {
  const stages = new Map<string, string[]>();
  let current: string[] | undefined;
  for (const line of text
    .replace(/\\\n/g, " ")
    .split("\n")
    .map((l) => l.trim())) {
    if (!line || line.startsWith("#")) continue;
    const from = /^FROM\s+\S+(?:\s+AS\s+(\S+))?$/i.exec(line);
    if (from) stages.set(from[1] ?? `stage-${stages.size}`, (current = []));
    if (!current) throw new Error(`${file}: '${line}' before any FROM`);
    current.push(line);
  }
  return stages;
}

/** The target stage `service` of a Dockerfile as a Recipe, on top of the stage it starts FROM; throws naming the line it cannot follow. */
export function parseDockerfile(service: string, text: string, file: string): Recipe {
  const stages = stagesOf(text, file);
  const recipe: Recipe = { service, deploy: "", base: "", packages: [], env: {}, workdir: "/", user: "root", entrypoint: [] };
  readStage(stages, service, recipe, file);
  if (!recipe.deploy) throw new Error(`${file}: target ${service} copies no 'pnpm deploy' output to /app`);
  if (!BASES[recipe.base]) throw new Error(`${file}: base ${recipe.base} is not one of ${Object.keys(BASES).join(", ")}`);
  if (recipe.entrypoint.length === 0) throw new Error(`${file}: no ENTRYPOINT`);
  return recipe;
}

/** One stage's instructions into the recipe; a FROM that names another stage reads that stage first. */
function readStage(stages: Map<string, string[]>, name: string, recipe: Recipe, file: string): void {
  const stage = stages.get(name);
  if (!stage) throw new Error(`${file}: no target ${name} (FROM … AS ${name})`);
  for (const line of stage) {
    const [instruction, rest] = [line.split(/\s+/, 1)[0]!.toUpperCase(), line.replace(/^\S+\s+/, "")];
    const copied = /^--from=(\S+) (\S+) \/app$/.exec(rest);
    const from = rest.split(/\s+/)[0]!;
    if (instruction === "FROM" && stages.has(from)) readStage(stages, from, recipe, file);
    else if (instruction === "FROM") recipe.base = from;
    else if (instruction === "RUN" && /apt-get install/.test(rest)) recipe.packages = aptInstallList(rest, file);
    else if (instruction === "ENV") Object.assign(recipe.env, Object.fromEntries([...rest.matchAll(/(\w+)=(\S+)/g)].map((m) => [m[1]!, m[2]!])));
    else if (instruction === "WORKDIR") recipe.workdir = rest;
    else if (instruction === "USER") recipe.user = rest;
    else if (instruction === "ENTRYPOINT") recipe.entrypoint = JSON.parse(rest) as string[];
    else if (instruction === "COPY" && copied) recipe.deploy = deployedTo(stages.get(copied[1]!) ?? [], copied[2]!, file);
    else throw new Error(`${file}: the image builder does not know target ${name}'s '${line}'`);
  }
}

/** The workspace package a build stage's `pnpm deploy --filter <package> … <dir>` puts at dir. */
function deployedTo(stage: string[], dir: string, file: string): string {
  for (const command of stage.flatMap((line) => line.split("&&"))) {
    const deploy = /pnpm deploy --filter (\S+) .*?(\S+)$/.exec(command.trim());
    if (deploy?.[2] === dir) return deploy[1]!;
  }
  throw new Error(`${file}: no 'pnpm deploy --filter <package> … ${dir}' in the stage the target copies from`);
}

function aptInstallList(run: string, file: string): string[] {
  const match = /apt-get install -y --no-install-recommends ((?:[a-z0-9][a-z0-9.+-]*\s*)+)/.exec(run);
  if (!match) throw new Error(`${file}: cannot read the packages of '${run}'`);
  return match[1]!.trim().split(/\s+/);
}

/** One image to make: its reference, its layers (each a list of files or a directory), its config. */
export interface Image {
  ref: string;
  layers: Layer[];
  config: { Entrypoint: string[]; Env: string[]; WorkingDir: string; User: string };
}

type Layer = { debian: string[]; without: string[] } | { directory: string; at: string } | { file: string; at: string };

const PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** The image a Dockerfile recipe describes; its /app comes from `pnpm deploy` into appDir. */
export function image(recipe: Recipe, ref: string, appDir: string): Image {
  const base = BASES[recipe.base]!;
  return {
    ref,
    layers: [
      { debian: base, without: [] },
      { debian: recipe.packages, without: base },
      { directory: appDir, at: "/app" },
    ],
    config: { Entrypoint: recipe.entrypoint, Env: [PATH, ...Object.entries(recipe.env).map(([k, v]) => `${k}=${v}`)], WorkingDir: recipe.workdir, User: recipe.user },
  };
}

/** An image of one static binary at /<name>, run as its entrypoint (the sidecars, pause). */
export function binaryImage(ref: string, binary: string, args: string[] = []): Image {
  const at = `/${path.basename(binary)}`;
  return { ref, layers: [{ file: binary, at }], config: { Entrypoint: [at, ...args], Env: [PATH], WorkingDir: "/", User: "0" } };
}

/** A shell image for the tests' applications: the base alone. */
export function shellImage(ref: string): Image {
  return { ref, layers: [{ debian: BASES["node:20-bookworm-slim"]!, without: [] }], config: { Entrypoint: [], Env: [PATH], WorkingDir: "/", User: "0" } };
}

/** `pnpm deploy` of a recipe's package: the built dist and its production dependencies. */
export async function deployApp(recipe: Recipe, dir: string): Promise<void> {
  await fs.rm(dir, { recursive: true, force: true });
  await run("pnpm", ["deploy", "--filter", recipe.deploy, "--prod", "--legacy", dir], { cwd: ROOT, env: { ...process.env, CI: "true" }, maxBuffer: 64 * 1024 * 1024 });
  // pnpm 10 also links the deployed package's bins under <workspace><dir>/node_modules/.bin: take that stray copy away again.
  const stray = path.join(ROOT, path.relative("/", dir));
  await fs.rm(stray, { recursive: true, force: true });
  for (let parent = path.dirname(stray); parent !== ROOT; parent = path.dirname(parent)) {
    if ((await fs.readdir(parent).catch(() => ["absent"])).length > 0) break;
    await fs.rmdir(parent);
  }
}

/** Writes the image as an OCI image layout archive at out; work holds the layers meanwhile. */
export async function buildImage(img: Image, out: string, work: string): Promise<void> {
  await fs.rm(work, { recursive: true, force: true });
  const blobs = path.join(work, "layout", "blobs", "sha256");
  await fs.mkdir(blobs, { recursive: true });
  const layers = [];
  let closure: string[] = [];
  for (const [i, layer] of img.layers.entries()) {
    const tar = path.join(work, `layer${i}.tar`);
    if ("debian" in layer) {
      const below = new Set(closure);
      closure = packageClosure([...closure, ...layer.debian]);
      await cachedDebianLayer(
        closure.filter((p) => !below.has(p)),
        closure,
        path.join(work, `rootfs${i}`),
        tar,
      );
    } else await directoryLayer(layer, path.join(work, `dir${i}`), tar);
    layers.push(await blob(blobs, tar, "application/vnd.oci.image.layer.v1.tar"));
  }
  const config = Buffer.from(
    JSON.stringify({
      architecture: "amd64",
      os: "linux",
      config: img.config,
      rootfs: { type: "layers", diff_ids: layers.map((l) => l.digest) },
    }),
  );
  const configBlob = await blobOf(blobs, config, "application/vnd.oci.image.config.v1+json");
  const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json", config: configBlob, layers }));
  const manifestBlob = await blobOf(blobs, manifest, "application/vnd.oci.image.manifest.v1+json");
  const layout = path.join(work, "layout");
  await fs.writeFile(path.join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  await fs.writeFile(
    path.join(layout, "index.json"),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [{ ...manifestBlob, annotations: { "io.containerd.image.name": img.ref, "org.opencontainers.image.ref.name": img.ref.slice(img.ref.lastIndexOf(":") + 1) } }],
    }),
  );
  await run("tar", ["-C", layout, "-cf", out, "oci-layout", "index.json", "blobs"]);
  await fs.rm(work, { recursive: true, force: true });
}

interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
}

async function blob(blobs: string, file: string, mediaType: string): Promise<Descriptor> {
  const hash = crypto.createHash("sha256");
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  const hex = hash.digest("hex");
  await fs.rename(file, path.join(blobs, hex));
  return { mediaType, digest: `sha256:${hex}`, size: (await fs.stat(path.join(blobs, hex))).size };
}

async function blobOf(blobs: string, data: Buffer, mediaType: string): Promise<Descriptor> {
  const hex = crypto.createHash("sha256").update(data).digest("hex");
  await fs.writeFile(path.join(blobs, hex), data);
  return { mediaType, digest: `sha256:${hex}`, size: data.length };
}

/** Installed packages with what they provide, from dpkg's database. */
function installed(): Map<string, { depends: string; provides: string[] }> {
  const out = execFileSync("dpkg-query", ["-W", "-f=${Package}\t${db:Status-Abbrev}\t${Pre-Depends}, ${Depends}\t${Provides}\n"], { encoding: "utf8", maxBuffer: 64 * 1024 * 1024 });
  const packages = new Map<string, { depends: string; provides: string[] }>();
  for (const line of out.split("\n").filter(Boolean)) {
    const [name, status, depends, provides] = line.split("\t") as [string, string, string, string];
    if (status.trim() === "ii")
      packages.set(name, {
        depends,
        provides: provides
          .split(",")
          .map((p) => p.trim().split(/\s/)[0]!)
          .filter(Boolean),
      });
  }
  return packages;
}

/** The packages and everything they depend on, as installed here; throws naming a dependency nothing installed satisfies. */
export function packageClosure(roots: string[]): string[] {
  const db = installed();
  const providers = new Map<string, string>();
  for (const [name, p] of db) for (const virtual of p.provides) if (!providers.has(virtual)) providers.set(virtual, name);
  const resolve = (name: string) => (db.has(name) ? name : providers.get(name));
  const seen = new Set<string>();
  const visit = (name: string, wantedBy: string) => {
    const found = resolve(name);
    if (!found) throw new Error(`${wantedBy} needs the Debian package ${name}, which is not installed: run 'make apt'`);
    if (seen.has(found) || OMITTED.has(found)) return;
    seen.add(found);
    for (const clause of db
      .get(found)!
      .depends.split(",")
      .map((c) => c.trim())
      .filter(Boolean)) {
      const alternatives = clause.split("|").map((a) => a.trim().split(/[\s:(]/)[0]!);
      const chosen = alternatives.find((a) => resolve(a)) ?? alternatives[0]!;
      visit(chosen, found);
    }
  };
  for (const root of roots) visit(root, "the image");
  return [...seen].sort();
}

/**
 * A Debian layer from .cache/images, made once for the installed versions of
 * its packages: the three driver images share their base, and a second run
 * makes none.
 */
async function cachedDebianLayer(packages: string[], closure: string[], rootfs: string, tar: string): Promise<void> {
  const versions = execFileSync("dpkg-query", ["-W", "-f=${Package}=${Version}\n", ...closure], { encoding: "utf8" });
  const key = crypto
    .createHash("sha256")
    .update(JSON.stringify({ packages, versions, SLIM: SLIM.source }))
    .digest("hex")
    .slice(0, 32);
  const cached = path.join(ROOT, ".cache", "images", `debian-${key}.tar`);
  if (
    !(await fs.stat(cached).then(
      () => true,
      () => false,
    ))
  ) {
    await fs.mkdir(path.dirname(cached), { recursive: true });
    await debianLayer(packages, closure, rootfs, `${cached}.${process.pid}`);
    await fs.rename(`${cached}.${process.pid}`, cached);
  }
  await fs.copyFile(cached, tar);
}

/**
 * A layer of the files the packages installed here (dpkg -L), with what
 * their maintainer scripts would have generated: /etc/passwd and /etc/group
 * (plus the node user, uid 1000, as in the node images), the CA bundle, and
 * the dynamic linker's cache. The whole closure is assembled so the cache
 * covers the layers below; the layer holds the new packages' files.
 */
async function debianLayer(packages: string[], closure: string[], rootfs: string, tar: string): Promise<void> {
  const all = await packageFiles(closure);
  await fs.mkdir(rootfs, { recursive: true });
  const list = `${rootfs}.list`;
  // Directories without their contents: only what the packages own is copied.
  await fs.writeFile(list, all.map((f) => f.slice(1)).join("\n"));
  await copyListed(list, rootfs);
  const generated = ["etc/ld.so.cache"];
  if (packages.includes("base-passwd")) generated.push(...(await accounts(rootfs)));
  if (packages.includes("ca-certificates")) generated.push(await copyGenerated("/etc/ssl/certs/ca-certificates.crt", rootfs));
  await run("ldconfig", ["-r", rootfs]);
  const lower = packages.length === closure.length;
  if (lower) generated.push(...(await usrMerge(rootfs)), await tmp(rootfs));
  const own = lower ? all : await packageFiles(packages);
  await fs.writeFile(list, [...own.map((f) => f.slice(1)), ...generated].join("\n"));
  await run("tar", ["-C", rootfs, "--no-recursion", "--numeric-owner", "--mtime=@0", "-cf", tar, "-T", list]);
  await fs.rm(rootfs, { recursive: true, force: true });
  await fs.rm(list, { force: true });
}

/** The paths the packages own, sorted, parents before children, on merged /usr. */
async function packageFiles(packages: string[]): Promise<string[]> {
  const files = new Set<string>();
  for (const pkg of packages) {
    for (const file of execFileSync("dpkg-query", ["-L", pkg], { encoding: "utf8", maxBuffer: 64 * 1024 * 1024 }).split("\n")) {
      if (!file.startsWith("/") || file === "/." || SLIM.test(file)) continue;
      files.add(await canonical(file));
    }
  }
  files.delete("/");
  return [...files].sort();
}

/** A path as this merged-/usr system stores it: /lib/x → /usr/lib/x. */
async function canonical(file: string): Promise<string> {
  const dir = await fs.realpath(path.dirname(file)).catch(() => path.dirname(file));
  return path.join(dir, path.basename(file));
}

/** /bin, /sbin, /lib, /lib64 as the symbolic links into /usr this system has (merged /usr). */
async function usrMerge(rootfs: string): Promise<string[]> {
  const links = [];
  for (const link of ["bin", "sbin", "lib", "lib64"]) {
    const target = await fs.readlink(`/${link}`).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "EINVAL" || err.code === "ENOENT") return undefined; // a directory, or absent: nothing to link
      throw err;
    });
    const present = await fs.lstat(path.join(rootfs, link)).then(
      () => true,
      () => false,
    );
    if (!target || present) continue; // a package listed the link itself
    await fs.symlink(target, path.join(rootfs, link));
    links.push(link);
  }
  return links;
}

async function tmp(rootfs: string): Promise<string> {
  await fs.mkdir(path.join(rootfs, "tmp"), { recursive: true });
  await fs.chmod(path.join(rootfs, "tmp"), 0o1777);
  return "tmp";
}

/** /etc/passwd and /etc/group from base-passwd's masters, and the node images' node user. */
async function accounts(rootfs: string): Promise<string[]> {
  const master = (name: string) => readFileSync(`/usr/share/base-passwd/${name}.master`, "utf8");
  await fs.writeFile(path.join(rootfs, "etc", "passwd"), `${master("passwd")}node:x:1000:1000::/home/node:/bin/bash\n`);
  await fs.writeFile(path.join(rootfs, "etc", "group"), `${master("group")}node:x:1000:\n`);
  await fs.mkdir(path.join(rootfs, "home", "node"), { recursive: true });
  await fs.chown(path.join(rootfs, "home", "node"), 1000, 1000);
  return ["etc/passwd", "etc/group", "home", "home/node"];
}

/** A file a package's maintainer script generates, taken as this machine generated it. */
async function copyGenerated(file: string, rootfs: string): Promise<string> {
  await fs.mkdir(path.join(rootfs, path.dirname(file)), { recursive: true });
  await fs.copyFile(file, path.join(rootfs, file));
  return file.slice(1);
}

async function directoryLayer(layer: { directory: string; at: string } | { file: string; at: string }, staging: string, tar: string): Promise<void> {
  const target = path.join(staging, layer.at);
  await fs.mkdir(path.dirname(target), { recursive: true });
  if ("directory" in layer) await run("cp", ["-a", layer.directory, target]);
  else {
    await fs.copyFile(layer.file, target);
    await fs.chmod(target, 0o755);
  }
  await run("tar", ["-C", staging, "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "--mtime=@0", "-cf", tar, "."]);
  await fs.rm(staging, { recursive: true, force: true });
}

/** Copies the listed paths (relative to /, no recursion) into rootfs, keeping owners and modes. */
async function copyListed(list: string, rootfs: string): Promise<void> {
  await run("bash", ["-o", "pipefail", "-c", 'tar -C / --no-recursion -cf - -T "$1" | tar -C "$2" -xpf -', "copy", list, rootfs], { maxBuffer: 16 * 1024 * 1024 });
}

/** Imports an archive into a containerd's k8s.io namespace, where the kubelet's CRI looks. */
export async function importImage(containerdSocket: string, archive: string): Promise<void> {
  await run("ctr", ["-a", containerdSocket, "-n", "k8s.io", "images", "import", "--all-platforms", archive], { maxBuffer: 16 * 1024 * 1024 });
}

/** The image references the chart names by default (values.yaml; an empty tag is Chart.yaml's appVersion). */
export function chartImageRefs(): Record<"csiFrontend" | "mountOwner" | "gitWorker" | "provisioner" | "resizer", string> {
  const values = readFileSync(path.join(ROOT, "charts", "git-csi", "values.yaml"), "utf8");
  const appVersion = /^appVersion: "?([^"\n]+)"?$/m.exec(readFileSync(path.join(ROOT, "charts", "git-csi", "Chart.yaml"), "utf8"))?.[1];
  const ref = (key: string) => {
    const block = new RegExp(`^  ${key}:\\n    repository: (\\S+)\\n    tag: "?([^"\\n]*)"?$`, "m").exec(values);
    if (!block || !(block[2] || appVersion)) throw new Error(`charts/git-csi/values.yaml: no images.${key} repository and tag`);
    return `${block[1]}:${block[2] || appVersion}`;
  };
  return { csiFrontend: ref("csiFrontend"), mountOwner: ref("mountOwner"), gitWorker: ref("gitWorker"), provisioner: ref("provisioner"), resizer: ref("resizer") };
}

/** Where `make cluster-tools` puts a sidecar of the version the chart pins. */
export function sidecarBinary(ref: string): string {
  const [repository, tag] = [ref.slice(0, ref.lastIndexOf(":")), ref.slice(ref.lastIndexOf(":") + 1)];
  const name = path.basename(repository);
  return path.join(ROOT, ".cache", "csi-sidecars", name, tag, name);
}

/** The chart's image keys of the driver's three services, and their packages. */
export const DRIVER_IMAGES = { csiFrontend: "csi-frontend", mountOwner: "mount-owner", gitWorker: "git-worker" } as const;

/** The archive of one service's image, made from its Dockerfile target, at dir/<service>.tar. */
export async function driverImage(service: string, ref: string, dir: string): Promise<string> {
  const recipe = recipeOf(service);
  const app = path.join(dir, `${service}-app`);
  const archive = path.join(dir, `${service}.tar`);
  await fs.mkdir(dir, { recursive: true });
  await deployApp(recipe, app);
  await buildImage(image(recipe, ref, app), archive, path.join(dir, `${service}-work`));
  await fs.rm(app, { recursive: true, force: true });
  return archive;
}

/**
 * Archives of every image the chart runs by default, under the references it
 * names, into dir: the three driver images from the Dockerfile's targets, and the
 * two controller sidecars.
 */
export async function chartImages(dir: string): Promise<string[]> {
  await fs.mkdir(dir, { recursive: true });
  const refs = chartImageRefs();
  const archives = [];
  for (const [key, service] of Object.entries(DRIVER_IMAGES) as [keyof typeof DRIVER_IMAGES, string][]) archives.push(await driverImage(service, refs[key], dir));
  for (const key of ["provisioner", "resizer"] as const) {
    const binary = sidecarBinary(refs[key]);
    if (
      !(await fs.stat(binary).then(
        () => true,
        () => false,
      ))
    )
      throw new Error(`no ${path.relative(ROOT, binary)}: run 'make cluster-tools'`);
    archives.push(path.join(dir, `${key}.tar`));
    await buildImage(binaryImage(refs[key], binary), archives.at(-1)!, path.join(dir, `${key}-work`));
  }
  return archives;
}
