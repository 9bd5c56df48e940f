// The chart against a real kube-apiserver: every rendered manifest is accepted
// by server-side dry-run, and the node and controller ServiceAccounts get what
// the driver needs and nothing more, as RBAC answers `kubectl auth can-i`.
import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { helmMissing, helmTemplate } from "../src/chart";
import { type Kube, kubeToolsMissing, startKube } from "../src/kube";

const NAMESPACE = "git-csi";

function missing(): string | undefined {
  return kubeToolsMissing() ?? helmMissing();
}

/** helm template's output split into its documents, each with its kind and name. */
interface Manifest {
  kind: string;
  name: string;
  text: string;
}

function split(rendered: string): Manifest[] {
  return rendered
    .split(/^---\s*$/m)
    .map((text) => text.trim())
    .filter((text) => /^kind:/m.test(text))
    .map((text) => ({ kind: /^kind:\s*(\S+)/m.exec(text)![1]!, name: /^metadata:\s*\n(?:\s+.*\n)*?\s+name:\s*(\S+)/m.exec(text)?.[1] ?? "", text }));
}

const RBAC_KINDS = new Set(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]);

const SUITE = "the chart against a real kube-apiserver";
const absent = missing();
// A missing tool fails: a skipped test has not run.
if (absent) test(SUITE, () => assert.fail(absent));
else
  describe(SUITE, () => {
    let kube: Kube;
    let dir: string;
    let manifests: Manifest[];

    before(async () => {
      dir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-kube-"));
      kube = await startKube(dir);
      manifests = split(await helmTemplate(NAMESPACE));
    });

    after(async () => {
      await kube?.stop();
      if (dir) await fs.rm(dir, { recursive: true, force: true });
    });

    /** Server-side dry-run of every manifest: the API server accepts each. */
    async function dryRun(ms: Manifest[]): Promise<void> {
      const out = await kube.kubectl(["apply", "--server-side", "--dry-run=server", "--field-manager=helm", "-f", "-"], ms.map((m) => m.text).join("\n---\n"));
      for (const m of ms) {
        assert.match(out, new RegExp(`\\b${m.name.replace(/[.]/g, "\\.")} serverside-applied \\(server dry run\\)`, "i"), `${m.kind} ${m.name} was not applied:\n${out}`);
      }
    }

    test("the API server serves VolumeAttributesClass as storage.k8s.io/v1", async () => {
      const resources = JSON.parse(await kube.kubectl(["get", "--raw", "/apis/storage.k8s.io/v1"])) as { resources: { name: string }[] };
      assert.ok(
        resources.resources.some((r) => r.name === "volumeattributesclasses"),
        JSON.stringify(resources.resources.map((r) => r.name)),
      );
    });

    test("every manifest the chart renders is accepted by server-side dry-run", async () => {
      await kube.kubectl(["create", "namespace", NAMESPACE]);
      assert.ok(manifests.length >= 10, `helm rendered ${manifests.length} manifests`);
      await dryRun(manifests);
      // Dry-run stores nothing: the node DaemonSet is not there afterwards.
      assert.equal((await kube.kubectl(["get", "daemonsets", "-n", NAMESPACE, "-o", "name"])).trim(), "");
    });

    test("an upgrade with new csi-frontend and git-worker images renders manifests the server accepts too, the mount-owner DaemonSet unchanged", async () => {
      await kube.kubectl(["get", "namespace", NAMESPACE]).catch(() => kube.kubectl(["create", "namespace", NAMESPACE]));
      const upgraded = split(await helmTemplate(NAMESPACE, ["--set", "images.csiFrontend.tag=upgrade", "--set", "images.gitWorker.tag=upgrade"]));
      const owner = (ms: Manifest[]) => ms.find((m) => m.kind === "DaemonSet" && m.name.endsWith("-mount-owner"))?.text;
      assert.ok(owner(manifests), "the chart renders a mount-owner DaemonSet");
      assert.equal(owner(upgraded), owner(manifests));
      await dryRun(upgraded);
    });

    describe("least-privilege RBAC", () => {
      let nodeSA: string;
      let controllerSA: string;

      before(async () => {
        await kube.kubectl(["get", "namespace", NAMESPACE]).catch(() => kube.kubectl(["create", "namespace", NAMESPACE]));
        const rbac = manifests.filter((m) => RBAC_KINDS.has(m.kind));
        await kube.kubectl(["apply", "--server-side", "--field-manager=helm", "-f", "-"], rbac.map((m) => m.text).join("\n---\n"));
        const accounts = manifests.filter((m) => m.kind === "ServiceAccount").map((m) => m.name);
        nodeSA = accounts.find((n) => n.endsWith("-node"))!;
        controllerSA = accounts.find((n) => n.endsWith("-controller"))!;
        assert.ok(nodeSA && controllerSA, `ServiceAccounts: ${accounts.join(", ")}`);
      });

      /** `kubectl auth can-i` as a ServiceAccount would ask, groups included; "--all-namespaces" or "-n ns" in where. */
      async function can(sa: string, verb: string, resource: string, where: string[] = ["--all-namespaces"]): Promise<boolean> {
        const args = [
          "auth",
          "can-i",
          verb,
          resource,
          ...where,
          `--as=system:serviceaccount:${NAMESPACE}:${sa}`,
          "--as-group=system:serviceaccounts",
          `--as-group=system:serviceaccounts:${NAMESPACE}`,
        ];
        // can-i prints yes or no, and exits 1 for no.
        const answer = await kube.kubectl(args).catch((err: Error) => (/\bno\b/.test(err.message) ? "no" : Promise.reject(err)));
        return answer.trim() === "yes";
      }

      async function expectRules(sa: string, allowed: [string, string, string[]?][], denied: [string, string, string[]?][]): Promise<void> {
        const wrong: string[] = [];
        for (const [verb, resource, where] of allowed) if (!(await can(sa, verb, resource, where))) wrong.push(`cannot ${verb} ${resource} ${where?.join(" ") ?? "cluster-wide"}`);
        for (const [verb, resource, where] of denied) if (await can(sa, verb, resource, where)) wrong.push(`can ${verb} ${resource} ${where?.join(" ") ?? "cluster-wide"}`);
        assert.deepEqual(wrong, [], `${sa}: ${wrong.join("; ")}`);
      }

      test("the node ServiceAccount reads volumes, claims and classes, posts events, reads and deletes pods for the recovery, and nothing else", async () => {
        const read = ["get", "list", "watch"];
        await expectRules(
          nodeSA,
          [
            ...read.map((v): [string, string] => [v, "persistentvolumes"]),
            ...read.map((v): [string, string] => [v, "persistentvolumeclaims"]),
            ...read.map((v): [string, string] => [v, "volumeattributesclasses.storage.k8s.io"]),
            ["create", "events"],
            ["patch", "events"],
            ["create", "events", ["-n", "an-application"]],
            ["create", "events.events.k8s.io"],
            ["patch", "events.events.k8s.io"],
            // node.deleteFencedPods, on by default: a lost epoch's pods are read for their controller and deleted.
            ["get", "pods"],
            ["delete", "pods"],
          ],
          [
            ["list", "secrets"],
            ["get", "secrets", ["-n", NAMESPACE]],
            ["list", "pods"],
            ["create", "pods"],
            ["update", "pods"],
            ["update", "persistentvolumes"],
            ["patch", "persistentvolumes"],
            ["delete", "persistentvolumeclaims"],
            ["update", "persistentvolumeclaims"],
            ["create", "volumeattributesclasses.storage.k8s.io"],
            ["delete", "events"],
            ["list", "events"],
            ["get", "nodes"],
            ["list", "configmaps"],
            ["create", "serviceaccounts", ["--all-namespaces", "--subresource=token"]],
            ["*", "*"],
          ],
        );
      });

      test("the controller ServiceAccount provisions and modifies volumes, and nothing else", async () => {
        await expectRules(
          controllerSA,
          [
            ["create", "persistentvolumes"],
            ["delete", "persistentvolumes"],
            ["patch", "persistentvolumes"],
            ["watch", "persistentvolumeclaims"],
            ["update", "persistentvolumeclaims"],
            ["patch", "persistentvolumeclaims", ["--all-namespaces", "--subresource=status"]],
            ["list", "storageclasses.storage.k8s.io"],
            ["get", "volumeattributesclasses.storage.k8s.io"],
            ["watch", "volumeattributesclasses.storage.k8s.io"],
            ["create", "events"],
            ["create", "leases.coordination.k8s.io", ["-n", NAMESPACE]],
            ["update", "leases.coordination.k8s.io", ["-n", NAMESPACE]],
          ],
          [
            ["list", "secrets"],
            ["get", "secrets", ["-n", NAMESPACE]],
            ["delete", "pods"],
            ["create", "pods"],
            ["delete", "persistentvolumeclaims"],
            ["create", "volumeattributesclasses.storage.k8s.io"],
            ["update", "volumeattributesclasses.storage.k8s.io"],
            ["create", "leases.coordination.k8s.io", ["-n", "kube-system"]],
            ["create", "storageclasses.storage.k8s.io"],
            ["update", "nodes"],
            ["*", "*"],
          ],
        );
      });
    });
  });
