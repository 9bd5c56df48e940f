import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import fc from "fast-check";
import { call, csi, CsiError } from "@git-csi/protos";
import { mountCapability, mountsUnder, startDriver } from "../src/driver";
import { startGitDaemon } from "../src/git-server";

// Generated CSI requests and class parameters, well-formed and malformed, sent
// over the CSI socket to the real services with a real remote. Every answer is
// a success or a gRPC status with a message; a malformed request is refused
// with InvalidArgument naming a field it got wrong, and changes nothing: not
// the node's files (volume records, work trees, repositories, sessions), not
// its mounts, not the remote.

const Mode = csi.VolumeCapability_AccessMode_Mode;
const T = 60_000;
const POD = "csi.storage.k8s.io/pod";

/** A generated value of one field; `bad` names the field when the value breaks its rule. */
interface Gen<T> {
  value: T;
  bad?: string;
}

/** Six well-formed values to one malformed one, so that requests with every field right are common. */
function field<T>(ok: fc.Arbitrary<T>, name: string, wrong: fc.Arbitrary<T>): fc.Arbitrary<Gen<T>> {
  return fc.oneof({ weight: 6, arbitrary: ok.map((value) => ({ value })) }, { weight: 1, arbitrary: wrong.map((value) => ({ value, bad: name })) });
}

interface Requests {
  create: csi.CreateVolumeRequest;
  delete: csi.DeleteVolumeRequest;
  modify: csi.ControllerModifyVolumeRequest;
  validate: csi.ValidateVolumeCapabilitiesRequest;
  stage: csi.NodeStageVolumeRequest;
  unstage: csi.NodeUnstageVolumeRequest;
  publish: csi.NodePublishVolumeRequest;
  unpublish: csi.NodeUnpublishVolumeRequest;
}
type Rpc = keyof Requests;

/** One generated request: which call, what it sends, and the fields it got wrong. */
type Generated = { [R in Rpc]: { rpc: R; request: Partial<Requests[R]>; bad: string[] } }[Rpc];

function generated<R extends Rpc>(rpc: R, fields: Record<string, Gen<unknown>>, request: Partial<Requests[R]>, extraBad: Array<string | undefined> = []): Generated {
  const bad = [...Object.values(fields).map((f) => f.bad), ...extraBad].filter((b): b is string => b !== undefined);
  return { rpc, request, bad } as Generated;
}

const ACCESS_MODES = [Mode.SINGLE_NODE_SINGLE_WRITER, Mode.SINGLE_NODE_WRITER, Mode.SINGLE_NODE_MULTI_WRITER];
const modeName = (mode: csi.VolumeCapability_AccessMode_Mode) => (mode === Mode.SINGLE_NODE_SINGLE_WRITER ? "ReadWriteOncePod" : "ReadWriteOnce");
const mount = { fsType: "", mountFlags: [], volumeMountGroup: "" };
const GOOD_CAPABILITY = fc.constantFrom(...ACCESS_MODES).map((mode) => mountCapability(mode));
/** A capability the driver serves no volume with. */
const BAD_CAPABILITY: fc.Arbitrary<csi.VolumeCapability> = fc.oneof(
  fc.constantFrom(...ACCESS_MODES).map((mode) => ({ block: {}, accessMode: { mode } })),
  fc.constant<csi.VolumeCapability>({ mount: { ...mount, fsType: "ext4" }, accessMode: { mode: Mode.SINGLE_NODE_WRITER } }),
  fc.constant<csi.VolumeCapability>({ mount: { ...mount, mountFlags: ["noatime"] }, accessMode: { mode: Mode.SINGLE_NODE_WRITER } }),
  fc.constantFrom(Mode.UNKNOWN, Mode.MULTI_NODE_SINGLE_WRITER, Mode.MULTI_NODE_MULTI_WRITER).map((mode) => mountCapability(mode)),
  fc.constant<csi.VolumeCapability>({ mount, accessMode: undefined }),
  fc.constant<csi.VolumeCapability>({ accessMode: { mode: Mode.SINGLE_NODE_WRITER } }),
);

const VOLUME_ID = field(
  fc.constantFrom("fuzz-a", "fuzz-b", "fuzz-c"),
  "volume_id",
  fc.oneof(
    fc.constantFrom("", "../etc", "../provisioned/fuzz-a", "a/b", "x".repeat(10_000), "-x", ".x", "a..b", "x.lock", "x."),
    fc.string({ minLength: 1, maxLength: 20 }).map((s) => `${s}/`),
  ),
);

const REF = field(
  fc.constantFrom("main", "main", "refs/heads/main", "trunk"),
  "ref",
  fc.oneof(
    fc.constantFrom("", "--help", "-x", "HEAD", "refs/heads/HEAD", "a..b", "refs/tags/v1", "x.lock", "@{-1}", "a b", "main:evil", "*", ".hidden"),
    fc.string({ maxLength: 10 }).map((s) => `-${s}`),
    fc.string({ maxLength: 10 }).map((s) => `${s}..${s}`),
  ),
);

const SECRETS = field<Record<string, string>>(
  fc.constant({}),
  "secrets",
  fc.constantFrom<Record<string, string>>({ apikey: "s3cr3t" }, { username: "u" }, { password: "p" }, { known_hosts: "h" }, { "ssh-privatekey": "not a key" }),
);

const CLASS_OK = fc.record(
  {
    "push.quiesce": fc.constantFrom("5s", "30s", "1m"),
    "push.maxLatency": fc.constantFrom("5m", "1h"),
    "commit.maxFileSize": fc.constantFrom("1Mi", "500k", "1048576"),
    "commit.author": fc.constant("Home Assistant <homeassistant@home.example>"),
    ignore: fc.constantFrom(".storage/,*.db*", "*.log"),
  },
  { requiredKeys: [] },
);
const KNOWN_PARAMETERS = ["push.quiesce", "push.maxLatency", "commit.maxFileSize", "commit.author", "ignore"];
/** One parameter that breaks its rule, or one the class does not take. */
const CLASS_BAD_ENTRY: fc.Arbitrary<[string, string]> = fc.oneof(
  fc.tuple(
    fc.constant("push.quiesce"),
    fc.oneof(
      fc.constantFrom("soon", "0s", "2h", "-1s", "1d", ""),
      fc.string().map((s) => `x${s}`),
    ),
  ),
  fc.tuple(
    fc.constant("push.maxLatency"),
    fc.oneof(
      fc.constantFrom("soon", "0s", "25h", "-1s"),
      fc.string().map((s) => `x${s}`),
    ),
  ),
  fc.tuple(
    fc.constant("commit.maxFileSize"),
    fc.oneof(
      fc.constantFrom("2Gi", "0", "1.5Mi", "-1"),
      fc.string().map((s) => `x${s}`),
    ),
  ),
  fc.tuple(
    fc.constant("commit.author"),
    fc.oneof(
      fc.constantFrom("nobody", "<a@b.example>", "A <b>"),
      fc.string().filter((s) => !s.includes("<")),
    ),
  ),
  fc.tuple(fc.constant("ignore"), fc.constantFrom("a\nb", "*.log,\r")),
  fc.tuple(
    fc.string({ maxLength: 20 }).filter((k) => !KNOWN_PARAMETERS.includes(k) && k !== "__proto__"),
    fc.string({ maxLength: 20 }),
  ),
);
const CLASS = field<Record<string, string>>(
  CLASS_OK,
  "mutable_parameters",
  fc.oneof(
    fc.tuple(CLASS_OK, CLASS_BAD_ENTRY).map(([ok, [key, value]]) => ({ ...ok, [key]: value })),
    fc.constant({ "push.quiesce": "10m", "push.maxLatency": "1m" }),
  ),
);

/** Paths the kubelet would never send: empty, relative, with a NUL, or longer than Linux takes. */
function badPath(dir: string): fc.Arbitrary<string> {
  return fc.oneof(
    fc.constantFrom("", "rel/dir", "./staging", "~/x", `${dir}/a\0b`, `${dir}/${"n".repeat(256)}`, `${dir}/${"d/".repeat(2100)}x`),
    fc.string({ minLength: 1, maxLength: 20 }).filter((s) => !s.startsWith("/")),
  );
}

interface Universe {
  dir: string;
  /** Well-formed URLs: the remote's repositories, one of which does not exist. */
  urls: string[];
  /** URLs that reach the node itself: its own store, the remote's disk, helper transports. */
  localUrls: string[];
}

function urlField(u: Universe, name: string): fc.Arbitrary<Gen<string>> {
  return field(
    fc.constantFrom(...u.urls),
    name,
    fc.oneof(
      fc.constantFrom("", "./fuzz.git", "~/fuzz.git", "fd::7", "nohelper::x", "-oProxyCommand=touch% x", "--upload-pack=touch /tmp/x", "ftp://h/x.git", "https://h/a b", ...u.localUrls),
      fc.string({ maxLength: 30 }).map((s) => `/${s}`),
      fc.string({ maxLength: 30 }).map((s) => `file://${s}`),
      fc.tuple(fc.stringMatching(/^[a-z][a-z0-9+.-]{0,8}$/), fc.string({ maxLength: 20 })).map(([helper, rest]) => `${helper}::${rest}`),
    ),
  );
}

/** The capability and volume_context.accessMode of a node call: a recorded mode the capability contradicts is malformed. */
interface NodeCapability {
  capability: Gen<csi.VolumeCapability | undefined>;
  context: Record<string, string>;
  bad?: string;
}

function nodeCapability(): fc.Arbitrary<NodeCapability> {
  const capability = field<csi.VolumeCapability | undefined>(GOOD_CAPABILITY, "volume_capability", fc.oneof(fc.constant(undefined), BAD_CAPABILITY));
  const recorded = fc.oneof({ weight: 6, arbitrary: fc.constantFrom("absent", "match") }, { weight: 1, arbitrary: fc.constantFrom("other", "bogus") });
  return fc.tuple(capability, recorded).map(([capability, recorded]): NodeCapability => {
    const mode = capability.value?.accessMode?.mode;
    if (recorded === "bogus") return { capability, context: { accessMode: "ReadWriteMany" }, bad: "volume_context.accessMode" };
    if (capability.bad || mode === undefined || recorded === "absent") return { capability, context: {} };
    const name = recorded === "match" ? modeName(mode) : mode === Mode.SINGLE_NODE_SINGLE_WRITER ? "ReadWriteOnce" : "ReadWriteOncePod";
    return { capability, context: { accessMode: name }, bad: recorded === "other" ? "volume_capability" : undefined };
  });
}

function byRpc(u: Universe): Record<Rpc, fc.Arbitrary<Generated>> {
  const { create, del, modify, validate } = controllerRequests(u);
  return { create, delete: del, modify, validate, ...nodeRequests(u) };
}

function requests(u: Universe): fc.Arbitrary<Generated> {
  const { create, delete: del, modify, validate, stage, unstage, publish, unpublish } = byRpc(u);
  // Stages and publishes more often than the rest, so that refused requests meet staged and published volumes.
  const often = (arbitrary: fc.Arbitrary<Generated>) => ({ weight: 3, arbitrary });
  return fc.oneof(create, del, modify, validate, often(stage), unstage, often(publish), unpublish);
}

/**
 * The run's first requests, so that its coverage is no matter of chance: a
 * well-formed stage and publish of one volume, then one malformed request of
 * each call, drawn from that call's own generator with the run's seed.
 */
function firstRequests(u: Universe, url: string, seed: number): [Generated][] {
  const capability = mountCapability(Mode.SINGLE_NODE_WRITER);
  const stagingTargetPath = path.join(u.dir, "staging", "fuzz-a");
  const stage: Generated = { rpc: "stage", bad: [], request: { volumeId: "fuzz-a", stagingTargetPath, volumeCapability: capability, volumeContext: { url, ref: "main" } } };
  const targetPath = path.join(u.dir, "pods", "p1", "volume");
  const publish: Generated = { rpc: "publish", bad: [], request: { volumeId: "fuzz-a", stagingTargetPath, targetPath, volumeCapability: capability, volumeContext: {} } };
  const malformed = Object.values(byRpc(u)).map(
    (arbitrary) =>
      fc.sample(
        arbitrary.filter((g) => g.bad.length > 0),
        { seed, numRuns: 1 },
      )[0]!,
  );
  return [stage, publish, ...malformed].map((g) => [g]);
}

const capabilities = fc.oneof(
  { weight: 4, arbitrary: fc.array(GOOD_CAPABILITY, { minLength: 1, maxLength: 2 }) },
  { weight: 1, arbitrary: fc.array(fc.oneof(GOOD_CAPABILITY, BAD_CAPABILITY), { maxLength: 2 }) },
);

/** A ref field whose malformed values name the field under prefix. */
const refField = (prefix: string) => REF.map((g) => (g.bad ? { ...g, bad: `${prefix}.ref` } : g));

/** CreateVolume, DeleteVolume, ControllerModifyVolume and ValidateVolumeCapabilities requests. */
function controllerRequests(u: Universe): Record<"create" | "del" | "modify" | "validate", fc.Arbitrary<Generated>> {
  const name = field(
    fc.constantFrom("fuzz-a", "fuzz-b", "fuzz-c"),
    "name",
    VOLUME_ID.filter((g) => g.bad !== undefined).map((g) => g.value),
  );
  /** Two capabilities must agree on the one access mode a volume has; any capability the driver does not serve is malformed. */
  const capabilitiesBad = (caps: csi.VolumeCapability[]) => {
    const modes = new Set(caps.map((c) => (c.accessMode?.mode === undefined ? -1 : modeName(c.accessMode.mode))));
    const served = caps.every((c) => c.mount && c.mount.fsType === "" && c.mount.mountFlags.length === 0 && c.accessMode && ACCESS_MODES.includes(c.accessMode.mode));
    return caps.length === 0 || !served || modes.size > 1 ? "volume_capabilities" : undefined;
  };
  const storageClassExtra = field<Record<string, string>>(
    fc.constantFrom<Record<string, string>>({}, { "csi.storage.k8s.io/pvc/name": "data-app-0", "csi.storage.k8s.io/pvc/namespace": "default" }),
    "parameters",
    fc.oneof(
      fc.constant<Record<string, string>>({ "push.quiesce": "5s" }),
      fc
        .string({ maxLength: 20 })
        .filter((k) => !["url", "ref", "__proto__"].includes(k) && !k.startsWith("csi.storage.k8s.io/"))
        .map((k) => ({ [k]: "x" })),
    ),
  );
  const capacity = field<csi.CapacityRange | undefined>(
    fc.constantFrom(undefined, { requiredBytes: 1 << 20, limitBytes: 0 }, { requiredBytes: 0, limitBytes: 1 << 30 }),
    "capacity_range",
    fc.constantFrom({ requiredBytes: 10, limitBytes: 5 }, { requiredBytes: -1, limitBytes: 0 }),
  );
  const contentSource = field<csi.VolumeContentSource | undefined>(fc.constant(undefined), "volume_content_source", fc.constant({ snapshot: { snapshotId: "snap-1" } }));
  const create = fc.record({ name, capabilities, url: urlField(u, "parameters.url"), ref: refField("parameters"), extra: storageClassExtra, parameters: CLASS, capacity, contentSource }).map((f) =>
    generated(
      "create",
      { name: f.name, url: f.url, ref: f.ref, extra: f.extra, parameters: f.parameters, capacity: f.capacity, contentSource: f.contentSource },
      {
        name: f.name.value,
        volumeCapabilities: f.capabilities,
        parameters: { url: f.url.value, ref: f.ref.value, ...f.extra.value },
        mutableParameters: f.parameters.value,
        capacityRange: f.capacity.value,
        volumeContentSource: f.contentSource.value,
      },
      [capabilitiesBad(f.capabilities)],
    ),
  );
  const del = VOLUME_ID.map((id) => generated("delete", { id }, { volumeId: id.value }));
  const modify = fc.record({ id: VOLUME_ID, parameters: CLASS }).map((f) => generated("modify", f, { volumeId: f.id.value, mutableParameters: f.parameters.value }));
  const validate = fc
    .record({ id: VOLUME_ID, capabilities })
    .map((f) => generated("validate", { id: f.id }, { volumeId: f.id.value, volumeCapabilities: f.capabilities }, [f.capabilities.length === 0 ? "volume_capabilities" : undefined]));
  return { create, del, modify, validate };
}

/** NodeStageVolume, NodeUnstageVolume, NodePublishVolume and NodeUnpublishVolume requests. */
function nodeRequests(u: Universe): Record<"stage" | "unstage" | "publish" | "unpublish", fc.Arbitrary<Generated>> {
  const staging = (id: Gen<string>) => path.join(u.dir, "staging", id.bad ? "malformed" : id.value);
  const stagingPath = (id: Gen<string>) => field(fc.constant(staging(id)), "staging_target_path", badPath(u.dir));
  const targetPath = field(
    fc.constantFrom("p1", "p2", "p3").map((pod) => path.join(u.dir, "pods", pod, "volume")),
    "target_path",
    badPath(u.dir),
  );
  const podContext = field<Record<string, string>>(
    fc.constantFrom<Record<string, string>>({}, { [`${POD}.name`]: "app-0", [`${POD}.namespace`]: "default", [`${POD}.uid`]: "6f1c2b1e-8a4f-4f8e-9c53-0b6a8f3d2e11" }),
    `volume_context.${POD}`,
    fc.constantFrom<Record<string, string>>({ [`${POD}.name`]: "Bad_Name" }, { [`${POD}.namespace`]: "../kube-system" }, { [`${POD}.uid`]: "x y" }, { [`${POD}.name`]: "a".repeat(254) }),
  );
  const stage = VOLUME_ID.chain((id) =>
    fc.record({ id: fc.constant(id), staging: stagingPath(id), mode: nodeCapability(), url: urlField(u, "volume_context.url"), ref: refField("volume_context"), secrets: SECRETS }),
  ).map((f) =>
    generated(
      "stage",
      { id: f.id, staging: f.staging, capability: f.mode.capability, url: f.url, ref: f.ref, secrets: f.secrets },
      {
        volumeId: f.id.value,
        stagingTargetPath: f.staging.value,
        volumeCapability: f.mode.capability.value,
        volumeContext: { ...f.mode.context, url: f.url.value, ref: f.ref.value },
        secrets: f.secrets.value,
      },
      [f.mode.bad],
    ),
  );
  const unstage = VOLUME_ID.chain((id) => fc.record({ id: fc.constant(id), staging: stagingPath(id) })).map((f) =>
    generated("unstage", f, { volumeId: f.id.value, stagingTargetPath: f.staging.value }),
  );
  const publish = VOLUME_ID.chain((id) =>
    fc.record({ id: fc.constant(id), staging: stagingPath(id), target: targetPath, mode: nodeCapability(), pod: podContext, secrets: SECRETS, readonly: fc.boolean() }),
  ).map((f) =>
    generated(
      "publish",
      { id: f.id, staging: f.staging, target: f.target, capability: f.mode.capability, pod: f.pod, secrets: f.secrets },
      {
        volumeId: f.id.value,
        stagingTargetPath: f.staging.value,
        targetPath: f.target.value,
        volumeCapability: f.mode.capability.value,
        volumeContext: { ...f.mode.context, ...f.pod.value },
        secrets: f.secrets.value,
        readonly: f.readonly,
      },
      [f.mode.bad],
    ),
  );
  const unpublish = fc.record({ id: VOLUME_ID, target: targetPath }).map((f) => generated("unpublish", f, { volumeId: f.id.value, targetPath: f.target.value }));
  return { stage, unstage, publish, unpublish };
}

/** Every file and directory under a directory, with a hash of each file; mount points are named, never entered. */
async function files(dir: string, mounts: Set<string>, skip: Set<string>, out: Record<string, string> = {}): Promise<Record<string, string>> {
  for (const entry of await fs.readdir(dir, { withFileTypes: true }).catch(() => [])) {
    const p = path.join(dir, entry.name);
    if (skip.has(p)) continue;
    if (mounts.has(p)) out[p] = "mount point";
    else if (entry.isDirectory()) await files(p, mounts, skip, Object.assign(out, { [p]: "directory" }));
    else
      out[p] = entry.isFile()
        ? createHash("sha256")
            .update(await fs.readFile(p))
            .digest("hex")
        : "other";
  }
  return out;
}

test("generated CSI requests: each answer is a success or a status naming the field, and a refused one changes nothing", async (t) => {
  const server = await startGitDaemon();
  t.after(() => server.stop());
  await server.createRepo("fuzz.git", { files: { "config.yaml": "a: 1\n" } });
  await server.createRepo("other.git");
  // Leases long enough that no renewal writes to the remote while the property runs.
  const driver = await startDriver({ lease: { duration: "1h", renewInterval: "30m" } });
  t.after(async () => {
    await driver.stop();
    // Generated names are many and long; the node's directory goes with the test.
    await fs.rm(driver.dir, { recursive: true, force: true });
  });
  const url = server.url("fuzz.git");
  // The node's own bare repository of fuzz.git, as git-worker's Store names it: another tenant's data.
  const ownRepository = path.join(driver.stateDir, "repos", `${createHash("sha256").update(url).digest("hex").slice(0, 16)}.git`);
  const marker = path.join(driver.dir, "ext-ran");
  const universe: Universe = {
    dir: driver.dir,
    urls: [url, url, server.url("other.git"), server.url("missing.git")],
    localUrls: [ownRepository, `file://${ownRepository}`, server.repoPath("fuzz.git"), `file://${server.repoPath("fuzz.git")}`, `ext::sh -c touch% ${marker}`],
  };
  const skip = new Set([path.join(driver.stateDir, "run"), path.join(driver.stateDir, "sockets")]);
  const observe = async () => {
    const mounts = await mountsUnder(driver.dir);
    return {
      files: await files(driver.dir, new Set(mounts), skip),
      mounts,
      remote: await Promise.all(["fuzz.git", "other.git"].map((repo) => server.git(repo, "for-each-ref", "--format=%(refname) %(objectname)"))),
    };
  };
  const send = (g: Generated): Promise<unknown> => {
    const { controller, node } = driver;
    switch (g.rpc) {
      case "create":
        return call(controller.createVolume.bind(controller), csi.CreateVolumeRequest.fromPartial(g.request), T);
      case "delete":
        return call(controller.deleteVolume.bind(controller), csi.DeleteVolumeRequest.fromPartial(g.request), T);
      case "modify":
        return call(controller.controllerModifyVolume.bind(controller), csi.ControllerModifyVolumeRequest.fromPartial(g.request), T);
      case "validate":
        return call(controller.validateVolumeCapabilities.bind(controller), csi.ValidateVolumeCapabilitiesRequest.fromPartial(g.request), T);
      case "stage":
        return call(node.nodeStageVolume.bind(node), csi.NodeStageVolumeRequest.fromPartial(g.request), T);
      case "unstage":
        return call(node.nodeUnstageVolume.bind(node), csi.NodeUnstageVolumeRequest.fromPartial(g.request), T);
      case "publish":
        return call(node.nodePublishVolume.bind(node), csi.NodePublishVolumeRequest.fromPartial(g.request), T);
      case "unpublish":
        return call(node.nodeUnpublishVolume.bind(node), csi.NodeUnpublishVolumeRequest.fromPartial(g.request), T);
    }
  };

  const seed = Number(process.env.FC_SEED ?? Date.now() % 2 ** 31);
  const numRuns = Number(process.env.FC_RUNS ?? 300);
  t.diagnostic(`seed ${seed} numRuns ${numRuns} (FC_SEED=${seed} FC_RUNS=${numRuns} repeats this run)`);
  const answers = new Map<string, number>();
  await fc.assert(
    fc.asyncProperty(requests(universe), async (g) => {
      const before = g.bad.length > 0 ? await observe() : undefined;
      const answer = await send(g).then(
        (response) => ({ code: status.OK, message: (response as { message?: string }).message ?? "", response }),
        (err: unknown) => {
          assert.ok(err instanceof CsiError, `${g.rpc} answered no gRPC status: ${String(err)}`);
          return { code: err.code, message: err.message, response: undefined };
        },
      );
      const key = `${g.rpc} ${g.bad.length > 0 ? "malformed" : "well-formed"} ${status[answer.code]}`;
      answers.set(key, (answers.get(key) ?? 0) + 1);
      if (before) {
        assert.equal(status[answer.code], "INVALID_ARGUMENT", `${g.rpc} with ${g.bad.join(", ")} wrong: ${answer.message}`);
        assert.ok(
          g.bad.some((name) => answer.message.includes(name)),
          `${g.rpc}: ${JSON.stringify(answer.message.slice(0, 300))} names none of ${g.bad.join(", ")}`,
        );
        assert.deepEqual(await observe(), before, `the refused ${g.rpc} changed the node or the remote`);
      } else {
        assert.ok(["OK", "NOT_FOUND", "FAILED_PRECONDITION", "ALREADY_EXISTS", "UNAVAILABLE"].includes(status[answer.code]), `well-formed ${g.rpc} answered ${status[answer.code]}: ${answer.message}`);
        if (answer.code !== status.OK) assert.notEqual(answer.message, "", `${g.rpc} answered ${status[answer.code]} without a message`);
        const confirmed = (answer.response as csi.ValidateVolumeCapabilitiesResponse | undefined)?.confirmed;
        if (g.rpc === "validate" && answer.code === status.OK && !confirmed) assert.match(answer.message, /volume_capabilities\[\d\]/);
      }
      await assert.rejects(fs.stat(marker), { code: "ENOENT" }, "an ext:: URL ran its command on the node");
    }),
    { seed, numRuns, endOnFailure: true, examples: firstRequests(universe, url, seed) },
  );
  t.diagnostic(`answers: ${JSON.stringify(Object.fromEntries([...answers].sort()))}`);
  // The property ran against every call, and against volumes that were staged and published.
  for (const rpc of ["create", "delete", "modify", "validate", "stage", "unstage", "publish", "unpublish"]) {
    assert.ok(
      [...answers.keys()].some((k) => k.startsWith(`${rpc} malformed`)),
      `no malformed ${rpc} was generated`,
    );
  }
  assert.ok((answers.get("stage well-formed OK") ?? 0) > 0 && (answers.get("publish well-formed OK") ?? 0) > 0, "no volume was staged and published");
});
