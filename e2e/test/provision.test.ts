// A branch per claim: CreateVolume renders a StorageClass's ref template from
// the provisioner's claim metadata and makes the branch on a real git server;
// DeleteVolume keeps, archives or deletes it as the class's onDelete says.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import { after, before, describe, test } from "node:test";
import { status } from "@grpc/grpc-js";
import { call, csi } from "@git-csi/protos";
import { deleteVolume, type Driver, mountCapability, refused, run, sh, stageAndPublish, startDriver, unpublishAndUnstage } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

const T = 60_000;
const TEMPLATE = "claims/${pvc.metadata.namespace}/${pvc.metadata.name}";
/** Armed, so the unstage commits and pushes; never on its own during a test. */
const QUIET = { "push.quiesce": "1h", "push.maxLatency": "2h" };

describe("provisioning: a branch per claim", { timeout: 10 * T }, () => {
  let server: GitServer;
  let driver: Driver;
  let url: string;
  let main: string;

  before(async () => {
    server = await startGitDaemon();
    main = await server.createRepo("config.git", { files: { "configuration.yaml": "homeassistant:\n" } });
    url = server.url("config.git");
    driver = await startDriver();
  });

  after(async () => {
    await driver?.stop();
    await server?.stop();
  });

  /** A StorageClass's parameters with what the external-provisioner adds for claim `pvc` in namespace home. */
  const claimParameters = (pvc: string, extra: Record<string, string> = {}, repoUrl = url) => ({
    url: repoUrl,
    ref: TEMPLATE,
    "csi.storage.k8s.io/pvc/namespace": "home",
    "csi.storage.k8s.io/pvc/name": pvc,
    "csi.storage.k8s.io/pv/name": `pv-${pvc}`,
    ...extra,
  });

  const create = async (name: string, parameters: Record<string, string>): Promise<csi.Volume> => {
    const request = csi.CreateVolumeRequest.fromPartial({ name, volumeCapabilities: [mountCapability()], parameters, mutableParameters: QUIET });
    return (await call(driver.controller.createVolume.bind(driver.controller), request, T)).volume!;
  };

  /** Every ref of the server's repository, name → commit. */
  const refs = async (repo = "config.git"): Promise<Record<string, string>> => {
    const listed = await server.git(repo, "for-each-ref", "--format=%(refname) %(objectname)");
    return Object.fromEntries(
      listed
        .split("\n")
        .filter(Boolean)
        .map((line) => line.split(" ") as [string, string]),
    );
  };

  const branchFile = (branch: string, file: string, repo = "config.git") => server.git(repo, "show", `refs/heads/${branch}:${file}`);

  /** A refused CreateVolume left no record: the controller does not know the name. */
  const unknown = (name: string) =>
    refused(
      call(driver.controller.validateVolumeCapabilities.bind(driver.controller), csi.ValidateVolumeCapabilitiesRequest.fromPartial({ volumeId: name, volumeCapabilities: [mountCapability()] }), T),
      status.NOT_FOUND,
      name,
    );

  test("two claims of one class get two branches at the default branch; a repeated CreateVolume moves neither", async () => {
    const ha = await create("pv-ha", claimParameters("ha"));
    const red = await create("pv-red", claimParameters("nodered"));
    assert.equal(ha.volumeContext.ref, "claims/home/ha");
    assert.equal(red.volumeContext.ref, "claims/home/nodered");
    const made = await refs();
    assert.equal(made["refs/heads/claims/home/ha"], main);
    assert.equal(made["refs/heads/claims/home/nodered"], main);

    const published = await stageAndPublish(driver, ha);
    await sh(`printf 'ha only\\n' > '${published.targetPath}/ha.yaml'`);
    await unpublishAndUnstage(driver, published);
    assert.equal(await branchFile("claims/home/ha", "ha.yaml"), "ha only");
    await assert.rejects(branchFile("main", "ha.yaml"));
    await assert.rejects(branchFile("claims/home/nodered", "ha.yaml"));

    const pushed = (await refs())["refs/heads/claims/home/ha"];
    assert.deepEqual(await create("pv-ha", claimParameters("ha")), ha);
    assert.equal((await refs())["refs/heads/claims/home/ha"], pushed, "the claim's own commits stay on its branch");
  });

  test("baseRef: a new branch starts at it; one the remote lacks is InvalidArgument and changes nothing", async () => {
    const staging = await server.commitFiles("config.git", { "staging.yaml": "stage: true\n" }, { branch: "staging" });
    await create("pv-stg", claimParameters("stg", { baseRef: "staging" }));
    assert.equal((await refs())["refs/heads/claims/home/stg"], staging);

    const before = await refs();
    await refused(create("pv-nobase", claimParameters("nobase", { baseRef: "nope" })), status.INVALID_ARGUMENT, ["parameters.baseRef", '"nope" does not exist']);
    assert.deepEqual(await refs(), before);
    await unknown("pv-nobase");
  });

  test("a bad template or onDelete is InvalidArgument naming the parameter, and neither the remote nor the records change", async () => {
    const before = await refs();
    const cases: Array<[Record<string, string>, string[]]> = [
      [claimParameters("x", { ref: "claims/${pvc.metadata.uid}" }), ["parameters.ref", "${pvc.metadata.uid}"]],
      [claimParameters("x", { ref: "claims/${pvc.metadata.name}.lock" }), ["parameters.ref", 'renders "claims/x.lock"']],
      [{ url, ref: TEMPLATE }, ["parameters.ref", "--extra-create-metadata"]],
      [claimParameters("x", { ref: "main", onDelete: "delete" }), ["parameters.onDelete", "a branch per claim"]],
      [claimParameters("x", { onDelete: "shred" }), ["parameters.onDelete", "keep, archive, delete"]],
    ];
    for (const [parameters, fragments] of cases) await refused(create("pv-bad", parameters), status.INVALID_ARGUMENT, fragments);
    assert.deepEqual(await refs(), before);
    await unknown("pv-bad");
  });

  test("onDelete: keep leaves the branch, archive moves it and its side branch under refs/git-csi/archive/, delete deletes it; each again is no error", async () => {
    await create("pv-keep", claimParameters("keep"));
    await create("pv-arch", claimParameters("arch", { onDelete: "archive" }));
    await create("pv-del", claimParameters("del", { onDelete: "delete" }));
    const side = await server.commitFiles("config.git", { "conflict.yaml": "mine\n" }, { branch: "claims/home/arch.pv-arch" });
    const before = await refs();
    for (const volumeId of ["pv-keep", "pv-arch", "pv-del", "pv-keep", "pv-arch", "pv-del"]) await deleteVolume(driver, volumeId);

    const after = await refs();
    assert.equal(after["refs/heads/claims/home/keep"], main);
    assert.equal(after["refs/heads/claims/home/arch"], undefined);
    assert.equal(after["refs/heads/claims/home/arch.pv-arch"], undefined);
    assert.equal(after["refs/git-csi/archive/pv-arch/claims/home/arch"], before["refs/heads/claims/home/arch"]);
    assert.equal(after["refs/git-csi/archive/pv-arch/claims/home/arch.pv-arch"], side);
    assert.equal(after["refs/heads/claims/home/del"], undefined);
    assert.deepEqual(
      Object.keys(after).filter((r) => r.includes("/del")),
      [],
      "a deleted branch leaves no archive",
    );
  });

  test("an empty repository: the first claim's branch starts at an empty first commit, and a pod writes to it", async () => {
    await run("git", ["init", "--quiet", "--bare", server.repoPath("empty.git")]);
    const volume = await create("pv-empty", claimParameters("first", {}, server.url("empty.git")));
    const made = await refs("empty.git");
    assert.deepEqual(Object.keys(made), ["refs/heads/claims/home/first"]);
    assert.equal(await server.git("empty.git", "ls-tree", "refs/heads/claims/home/first"), "");

    const published = await stageAndPublish(driver, volume);
    assert.deepEqual(await fs.readdir(published.targetPath), []);
    await sh(`printf 'flows: []\\n' > '${published.targetPath}/flows.json'`);
    await unpublishAndUnstage(driver, published);
    assert.equal(await branchFile("claims/home/first", "flows.json", "empty.git"), "flows: []");
  });
});
