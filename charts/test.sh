#!/usr/bin/env bash
# Checks the git.liken.sh Helm chart: lint, render with default values and
# with the ServiceMonitor and the PrometheusRule on, parse every rendered
# manifest, check that values.schema.json rejects bad values, that the Grafana
# dashboard names only metrics the driver exports, that promtool accepts the
# alert rules the chart renders and that each alert fires when
# charts/rules.test.yaml says, and that the Home Assistant example matches
# spec 004. Installs helm (pinned) into .cache/bin if it is missing; promtool
# is Debian's prometheus package (`make apt`).
#
#   bash charts/test.sh
#
# Prints one line per check and a summary line; exits non-zero on any failure.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHART="$ROOT/charts/git-csi"
HELM_VERSION=v3.21.4
# A helm built with `go install` carries no ldflags, so it would assume
# Kubernetes v1.20 and refuse the chart's kubeVersion; render for the oldest
# Kubernetes the chart supports instead.
KUBE_VERSION=v1.34.0
BIN="$ROOT/.cache/bin"
export PATH="$BIN:$PATH"

# --- helm, idempotently -------------------------------------------------------
helm_module_version() {
  go version -m "$BIN/helm" 2>/dev/null | awk '$1 == "mod" && $2 == "helm.sh/helm/v3" { print $3 }'
}
if [ -x "$BIN/helm" ] && ! command -v go >/dev/null; then
  echo "go is not on PATH: using $BIN/helm without checking that it is $HELM_VERSION"
elif [ ! -x "$BIN/helm" ] || [ "$(helm_module_version)" != "$HELM_VERSION" ]; then
  echo "installing helm $HELM_VERSION into $BIN (go install; the first time takes a few minutes)"
  mkdir -p "$BIN"
  if ! GOBIN="$BIN" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"; then
    echo "chart: could not install helm $HELM_VERSION" >&2
    echo "chart: 0 passed, 1 failed"
    exit 1
  fi
fi
HELM="$BIN/helm"

# --- PyYAML, to parse what helm renders -------------------------------------------
# Debian's python3-yaml is usually there; otherwise it goes into .cache/python.
if ! python3 -c 'import yaml' 2>/dev/null; then
  export PYTHONPATH="$ROOT/.cache/python${PYTHONPATH:+:$PYTHONPATH}"
  if ! python3 -c 'import yaml' 2>/dev/null; then
    echo "installing PyYAML into $ROOT/.cache/python"
    python3 -m pip install --quiet --target "$ROOT/.cache/python" pyyaml || {
      echo "chart: could not install PyYAML" >&2
      echo "chart: 0 passed, 1 failed"
      exit 1
    }
  fi
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

PASSED=0
FAILED=0
FAILURES=()
# check NAME COMMAND...: runs the command, output to $WORK/log.
check() {
  local name=$1
  shift
  if "$@" >"$WORK/log" 2>&1; then
    PASSED=$((PASSED + 1))
    echo "ok   $name"
  else
    FAILED=$((FAILED + 1))
    FAILURES+=("$name")
    echo "FAIL $name"
    sed 's/^/     | /' "$WORK/log"
  fi
}

# The checks on parsed manifests, dashboard and examples, in one Python file.
cat >"$WORK/checks.py" <<'PY'
import glob, json, os, re, sys
import yaml

ROOT = os.environ["ROOT"]
CHART = os.path.join(ROOT, "charts", "git-csi")
DRIVER = "git.liken.sh"
# The metrics spec 004 names ("What the driver reports"); the dashboard shows each.
SPEC_METRICS = {
    "git_csi_volume_abnormal", "git_csi_armed", "git_csi_pending_paths", "git_csi_unpushed_commits",
    "git_csi_last_push_timestamp_seconds", "git_csi_push_failures_total", "git_csi_skipped_files", "git_csi_diverged",
}
problems = []

def expect(cond, message):
    if not cond:
        problems.append(message)
    return cond

def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for i, d in enumerate(docs):
        if not isinstance(d, dict) or not d.get("apiVersion") or not d.get("kind") or not (d.get("metadata") or {}).get("name"):
            raise SystemExit(f"{path}: document {i} has no apiVersion, kind or metadata.name: {str(d)[:200]}")
    return docs

def find(docs, kind, name_suffix=""):
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]

def containers(workload):
    return {c["name"]: c for c in workload["spec"]["template"]["spec"]["containers"]}

def arg(container, flag):
    for a in container.get("args", []):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None

def pinned(image):
    tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
    return tag not in ("", "latest")

def check_render(path, service_monitor, sidecars, prometheus_rule, delete_fenced_pods=True, provisioner_secrets=False, snapshots=False):
    docs = load(path)
    kinds = sorted(d["kind"] for d in docs)
    print(f"{len(docs)} manifests: {', '.join(kinds)}")

    drivers = find(docs, "CSIDriver")
    if expect(len(drivers) == 1, "one CSIDriver"):
        d = drivers[0]
        expect(d["metadata"]["name"] == DRIVER, f"CSIDriver is named {DRIVER}")
        want = {"attachRequired": False, "podInfoOnMount": True, "requiresRepublish": True, "fsGroupPolicy": "File", "volumeLifecycleModes": ["Persistent"]}
        for k, v in want.items():
            expect(d["spec"].get(k) == v, f"CSIDriver spec.{k} is {v!r}, not {d['spec'].get(k)!r}")

    sas = find(docs, "ServiceAccount")
    expect(len({s["metadata"]["name"] for s in sas}) == 2, "two ServiceAccounts, node and controller")

    expect(len(find(docs, "DaemonSet")) == 2, "two DaemonSets: the node plugin and the mount-owner")
    owners = find(docs, "DaemonSet", "-mount-owner")
    ds = find(docs, "DaemonSet", "-node")
    if expect(len(ds) == 1 and len(owners) == 1, "one node DaemonSet and one mount-owner DaemonSet"):
        ds, owner_ds = ds[0], owners[0]
        expect(ds["spec"]["updateStrategy"]["type"] == "RollingUpdate", "the node DaemonSet rolls its updates")
        expect(owner_ds["spec"]["updateStrategy"] == {"type": "OnDelete"}, "the mount-owner DaemonSet restarts a pod only when it is deleted (OnDelete)")
        spec = ds["spec"]["template"]["spec"]
        c = containers(ds)
        want = {"csi-frontend", "git-worker", "fd-keeper"} | ({"node-driver-registrar", "livenessprobe"} if sidecars else set())
        expect(set(c) == want, f"node containers: {sorted(c)}, not {sorted(want)}")
        expect(set(containers(owner_ds)) == {"mount-owner"}, f"mount-owner DaemonSet containers: {sorted(containers(owner_ds))}")
        c.update(containers(owner_ds))
        vols = {v["name"]: v for v in spec["volumes"] + owner_ds["spec"]["template"]["spec"]["volumes"]}
        host = lambda name: (vols.get(name) or {}).get("hostPath", {}).get("path")
        if "csi-frontend" in c:
            f = c["csi-frontend"]
            expect(arg(f, "--mode") == "node", "node csi-frontend runs --mode=node")
            expect(arg(f, "--endpoint") == "unix:///csi/csi.sock", "node csi-frontend serves /csi/csi.sock")
            csi_mount = [m for m in f["volumeMounts"] if m["mountPath"] == "/csi"]
            expect(csi_mount and host(csi_mount[0]["name"]) == f"/var/lib/kubelet/plugins/{DRIVER}", "the CSI socket is in the kubelet plugin dir")
            registration = [m for m in f["volumeMounts"] if m["mountPath"] == "/registration"]
            if sidecars:
                expect(arg(f, "--registration-dir") is None and not registration, "with the registrar sidecar the frontend does not register")
                expect(arg(f, "--health-address") is None, "with the livenessprobe sidecar the frontend serves no /healthz")
            else:
                expect(arg(f, "--registration-dir") == "/registration" and registration and host(registration[0]["name"]) == "/var/lib/kubelet/plugins_registry",
                       "the frontend registers in the kubelet's plugins_registry")
                expect(arg(f, "--kubelet-registration-path") == f"/var/lib/kubelet/plugins/{DRIVER}/csi.sock", "the frontend registers the kubelet-side socket path")
                health = {p["name"]: p["containerPort"] for p in f.get("ports", [])}.get("healthz")
                expect(arg(f, "--health-address") == f"0.0.0.0:{health}", "the frontend serves /healthz on the probed port")
        if "mount-owner" in c:
            m = c["mount-owner"]
            expect(m.get("securityContext", {}).get("privileged") is True, "mount-owner is privileged")
            kubelet = [v for v in m["volumeMounts"] if v["mountPath"] == "/var/lib/kubelet"]
            expect(kubelet and kubelet[0].get("mountPropagation") == "Bidirectional", "mount-owner has /var/lib/kubelet with Bidirectional propagation")
            expect(any(v["mountPath"] == "/dev/fuse" and host(v["name"]) == "/dev/fuse" for v in m["volumeMounts"]), "mount-owner has /dev/fuse")
            expect(any(host(v["name"]) == "/var/lib/git-csi" for v in m["volumeMounts"]), "mount-owner has the state hostPath")
            expect(arg(m, "--git-worker") == "unix:///var/lib/git-csi/sockets/git-worker.sock", "mount-owner dials the git-worker's socket")
            keeper = c.get("fd-keeper", {})
            socket = (keeper.get("command") or [None, None])[1]
            expect(socket is not None and arg(m, "--fd-keeper") == socket, f"mount-owner hands its FUSE descriptors to the fd-keeper's socket {socket}")
            # The socket is the same host file for both: each container mounts a hostPath at its own path.
            same_host = lambda container: any(socket and socket.startswith(v["mountPath"] + "/") and host(v["name"]) == v["mountPath"] for v in container.get("volumeMounts", []))
            expect(same_host(m) and same_host(keeper), "the fd-keeper's socket is on a hostPath both containers mount at the host's path")
        if "git-worker" in c:
            g = c["git-worker"]
            ports = {p["name"]: p["containerPort"] for p in g.get("ports", [])}
            expect("metrics" in ports, "git-worker declares a metrics containerPort")
            expect(arg(g, "--metrics-address") == f"0.0.0.0:{ports.get('metrics')}", "git-worker --metrics-address matches its metrics port")
            expect(any(host(v["name"]) == "/var/lib/git-csi" for v in g["volumeMounts"]), "git-worker has the state hostPath")
            expect(arg(g, "--owner-ref-retention") == "720h", "git-worker collects owner refs after node.ownerRefRetention, 720h by default")
            want = "true" if delete_fenced_pods else "false"
            expect(arg(g, "--delete-fenced-pods") == want, f"git-worker runs --delete-fenced-pods={want} as node.deleteFencedPods says (true by default)")
        if "node-driver-registrar" in c:
            expect(arg(c["node-driver-registrar"], "--kubelet-registration-path") == f"/var/lib/kubelet/plugins/{DRIVER}/csi.sock", "registrar registers the kubelet-side socket path")
        for name in ("csi-frontend", "mount-owner"):
            env = {e["name"]: e for e in c.get(name, {}).get("env", [])}
            expect(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName", f"{name} has NODE_NAME from spec.nodeName")
        for name in ("node-driver-registrar", "livenessprobe"):
            if name in c:
                expect(c[name]["image"].startswith("registry.k8s.io/sig-storage/") and pinned(c[name]["image"]), f"{name} image is a pinned sig-storage image: {c[name]['image']}")

    dep = find(docs, "Deployment")
    if expect(len(dep) == 1, "one controller Deployment"):
        dep = dep[0]
        expect(dep["spec"].get("replicas") == 1, "controller runs 1 replica")
        c = containers(dep)
        expect({"csi-frontend", "mount-owner", "git-worker", "csi-provisioner", "csi-resizer"} <= set(c), f"controller containers: {sorted(c)}")
        if "csi-frontend" in c:
            expect(arg(c["csi-frontend"], "--mode") == "controller", "controller csi-frontend runs --mode=controller")
        for name in ("csi-provisioner", "csi-resizer"):
            if name in c:
                expect(arg(c[name], "--feature-gates") == "VolumeAttributesClass=true", f"{name} has --feature-gates=VolumeAttributesClass=true")
                expect(c[name]["image"].startswith("registry.k8s.io/sig-storage/") and pinned(c[name]["image"]), f"{name} image is a pinned sig-storage image: {c[name]['image']}")
        if "csi-provisioner" in c:
            expect("--extra-create-metadata" in c["csi-provisioner"]["args"], "csi-provisioner sends the claim's metadata a ref template names (--extra-create-metadata)")
            sweep_off = "--snapshot-orphan-sweep-interval=0" in c["csi-provisioner"]["args"]
            expect(sweep_off != snapshots, f"csi-provisioner sweeps snapshot finalizers only with snapshots ({snapshots})")
        expect(("csi-snapshotter" in c) == snapshots, f"controller runs csi-snapshotter only with snapshots ({snapshots})")
        if "csi-snapshotter" in c:
            s = c["csi-snapshotter"]
            expect(s["image"].startswith("registry.k8s.io/sig-storage/csi-snapshotter:") and pinned(s["image"]), f"csi-snapshotter image is a pinned sig-storage image: {s['image']}")
            expect(arg(s, "--csi-address") == "/csi/csi.sock" and "--leader-election" in s["args"], "csi-snapshotter dials the controller's CSI socket and elects a leader")
            expect("--extra-create-metadata" in s["args"], "csi-snapshotter sends the VolumeSnapshot's metadata a tag template names (--extra-create-metadata)")
        sec = dep["spec"]["template"]["spec"].get("securityContext", {})
        expect(sec.get("runAsNonRoot") is True, "controller pod runs as non-root")

    roles = {r["metadata"]["name"]: r for r in find(docs, "ClusterRole")}
    node_role = [r for n, r in roles.items() if n.endswith("-node")]
    if expect(len(node_role) == 1, "one node ClusterRole"):
        rules = node_role[0]["rules"]
        def allows(group, resource, verbs):
            return any(group in r["apiGroups"] and resource in r["resources"] and set(verbs) <= set(r["verbs"]) for r in rules)
        for group, resource, verbs in [("", "persistentvolumes", ["get", "list", "watch"]), ("", "persistentvolumeclaims", ["get", "list", "watch"]),
                                       ("storage.k8s.io", "volumeattributesclasses", ["get", "list", "watch"]), ("", "events", ["create", "patch"])]:
            expect(allows(group, resource, verbs), f"node role allows {verbs} on {group or 'core'}/{resource}")
        # Recovery (node.deleteFencedPods): get and delete pods, and only then.
        expect(allows("", "pods", ["get", "delete"]) == delete_fenced_pods, f"node role allows get and delete on pods only with node.deleteFencedPods ({delete_fenced_pods})")
        writes = [r for r in rules if r["resources"] not in (["events"], ["pods"])]
        expect(not any(v in r["verbs"] for r in writes for v in ("*", "delete", "update")), "node role writes nothing but events, and deletes nothing but pods")
        expect(all(set(r["verbs"]) == {"get", "delete"} for r in rules if r["resources"] == ["pods"]), "node role's pods rule is get and delete alone")
    controller_role = [r for n, r in roles.items() if n.endswith("-controller")]
    if expect(len(controller_role) == 1, "one controller ClusterRole"):
        secrets = [r for r in controller_role[0]["rules"] if "secrets" in r["resources"]]
        want = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}] if provisioner_secrets else []
        expect(secrets == want, f"controller role reads secrets (get alone) only with controller.provisionerSecrets ({provisioner_secrets})")
        rules = controller_role[0]["rules"]
        snapshot_rules = {res: set(r["verbs"]) for r in rules if "snapshot.storage.k8s.io" in r["apiGroups"] for res in r["resources"]}
        want = {"volumesnapshots": {"get", "list", "watch", "update"}, "volumesnapshotcontents": {"get", "list", "watch", "update", "patch"},
                "volumesnapshotcontents/status": {"update", "patch"}, "volumesnapshotclasses": {"get", "list", "watch"}} if snapshots else {}
        expect(snapshot_rules == want, f"controller role's snapshot.storage.k8s.io rules are the provisioner's and the snapshotter's only with snapshots ({snapshots}): {snapshot_rules}")
        expect(not any("groupsnapshot.storage.k8s.io" in r["apiGroups"] for r in rules), "controller role has no group snapshot rules")
    classes = find(docs, "VolumeSnapshotClass")
    if snapshots:
        if expect(len(classes) == 1, "one VolumeSnapshotClass with snapshots"):
            expect(classes[0].get("driver") == DRIVER and classes[0].get("deletionPolicy") == "Delete", f"the VolumeSnapshotClass is the driver's, deletionPolicy Delete: {classes[0]}")
    else:
        expect(not classes, "no VolumeSnapshotClass without snapshots")
    for r in roles.values():
        expect(not any("*" in rule.get("verbs", []) or "*" in rule.get("resources", []) for rule in r["rules"]), f"{r['metadata']['name']} uses no wildcard")

    svc = [s for s in find(docs, "Service") if s["metadata"]["name"].endswith("-node-metrics")]
    expect(len(svc) == 1, "a Service for the node metrics")
    svc = [s for s in find(docs, "Service") if s["metadata"]["name"].endswith("-mount-owner-metrics")]
    expect(len(svc) == 1 and svc[0]["spec"]["selector"].get("app.kubernetes.io/component") == "mount-owner", "a Service for the mount-owner metrics")

    cms = [c for c in find(docs, "ConfigMap") if (c["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
    if expect(len(cms) == 1, "one ConfigMap labeled grafana_dashboard: \"1\""):
        with open(os.path.join(CHART, "dashboards", "git-csi.json")) as f:
            expect(json.loads(cms[0]["data"]["git-csi.json"]) == json.load(f), "the ConfigMap holds dashboards/git-csi.json")

    sms = find(docs, "ServiceMonitor")
    if service_monitor:
        if expect(len(sms) == 1, "one ServiceMonitor when metrics.serviceMonitor.enabled"):
            eps = sms[0]["spec"]["endpoints"]
            expect(eps and eps[0].get("port") == "metrics" and eps[0].get("honorLabels") is True, "ServiceMonitor scrapes port metrics with honorLabels")
    else:
        expect(not sms, "no ServiceMonitor by default")

    prs = find(docs, "PrometheusRule")
    if prometheus_rule:
        if expect(len(prs) == 1, "one PrometheusRule when metrics.prometheusRule.enabled"):
            pr = prs[0]
            expect(pr["apiVersion"] == "monitoring.coreos.com/v1", f"the PrometheusRule is monitoring.coreos.com/v1, not {pr['apiVersion']}")
            expect(pr["metadata"].get("namespace") == "monitoring", "the PrometheusRule is in metrics.prometheusRule.namespace")
            expect((pr["metadata"].get("labels") or {}).get("release") == "prometheus", "the PrometheusRule carries metrics.prometheusRule.labels")
            with open(os.path.join(CHART, "rules", "git-csi.yaml")) as f:
                expect(pr["spec"] == yaml.safe_load(f), "the PrometheusRule's spec is rules/git-csi.yaml, unchanged")
            # The rules as they ship, for check_rules and promtool.
            with open(os.path.join(os.path.dirname(path), "rules.yaml"), "w") as f:
                yaml.safe_dump(pr["spec"], f, sort_keys=False, width=1000)
    else:
        expect(not prs, "no PrometheusRule by default")

# --- the dashboard's metric names ---------------------------------------------
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan", "atan2"}

def metric_names(expr):
    """Metric names in a PromQL expression: identifiers that are not functions,
    aggregations, keywords, label names or variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)   # strings (matcher values, $vars in them)
    e = re.sub(r"\{[^}]*\}", "", e)                                             # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                                            # ranges and subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # label lists
    e = re.sub(r"\$\{?\w+\}?", " ", e)                                          # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.:])[a-zA-Z_:][a-zA-Z0-9_:]*(?![\w(])(?!\s*\()", e):
        word = m.group(0)
        if word.lower() not in PROMQL_WORDS and not re.fullmatch(r"(?i)[0-9.]*e[0-9]+", word):
            names.add(word)
    return names

def exported_metrics():
    names = set()
    for path in glob.glob(os.path.join(ROOT, "packages", "metrics", "src", "*.ts")):
        with open(path) as f:
            names |= set(re.findall(r'\bname:\s*["\']([a-zA-Z_:][a-zA-Z0-9_:]*)["\']', f.read()))
    return names

def check_dashboard():
    exported = exported_metrics()
    print(f"exported by packages/metrics: {', '.join(sorted(exported))}")
    expect(SPEC_METRICS <= exported, f"packages/metrics exports every spec 004 metric; missing: {sorted(SPEC_METRICS - exported)}")
    with open(os.path.join(CHART, "dashboards", "git-csi.json")) as f:
        dash = json.load(f)
    exprs = []
    def walk(node, where):
        if isinstance(node, dict):
            if "type" in node and "title" in node:
                where = f"panel {node['title']!r}"
            for k, v in node.items():
                if k == "expr" and isinstance(v, str):
                    exprs.append((where, v))
                else:
                    walk(v, where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)
    walk(dash.get("panels", []), "panels")
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]["query"] if isinstance(var.get("query"), dict) else var.get("query", "")
            m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_]\w*\s*\)\s*", q)
            exprs.append((f"variable ${var['name']}", m.group(1) if m else q))
    expect(exprs, "the dashboard has PromQL expressions")
    referenced = set()
    for where, expr in exprs:
        names = metric_names(expr)
        expect(names, f"{where}: no metric name found in {expr!r}")
        for name in names:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            known = name in exported or (base != name and base in exported)
            expect(known, f"{where}: {name} is not a metric the driver exports (in {expr!r})")
        referenced |= names
    print(f"{len(exprs)} expressions reference: {', '.join(sorted(referenced))}")
    expect(SPEC_METRICS <= referenced, f"the dashboard shows every spec 004 metric; missing: {sorted(SPEC_METRICS - referenced)}")
    expect(any(r.get("type") == "row" and r.get("repeat") == "claim" for r in dash.get("panels", [])), "a row repeats on the claim variable")
    expect(any("time() - " in e and "git_csi_last_push_timestamp_seconds" in e for _, e in exprs), "last push age is time() - git_csi_last_push_timestamp_seconds")
    expect(any(re.search(r"\b(rate|increase)\(git_csi_push_failures_total\b", e) for _, e in exprs), "push failures use rate/increase of git_csi_push_failures_total")
    expect(any(re.search(r"\bincrease\(git_csi_operations_total\b", e) and "by (node, operation)" in e for _, e in exprs), "a panel shows increase(git_csi_operations_total) by node and operation")
    expect(any(re.search(r'git_csi_operations_total\{operation="stale_epoch_refused"\}', e) for _, e in exprs), "a panel shows spec 000's stale-epoch refusals")

# --- the alert rules ------------------------------------------------------------
# Each alert, the metric it reads, and the labels its annotations name.
ALERTS = {
    "GitCsiVolumeAbnormal": ("git_csi_volume_abnormal", ("namespace", "claim", "node")),
    "GitCsiPushFailing": ("git_csi_push_failures_total", ("namespace", "claim", "node")),
    "GitCsiVolumeOnSideBranch": ("git_csi_diverged", ("namespace", "claim", "node")),
    "GitCsiStaleEpochRefused": ("git_csi_operations_total", ("node", "instance")),
    "GitCsiLeaseRenewalFailing": ("git_csi_operations_total", ("node", "instance")),
}

def operations():
    with open(os.path.join(ROOT, "packages", "metrics", "src", "index.ts")) as f:
        listed = re.search(r"const OPERATIONS = \[([^\]]*)\] as const", f.read())
    return set(re.findall(r'"(\w+)"', listed.group(1))) if listed else set()

def check_rules(path):
    """The rendered PrometheusRule's rules: what each reads and says."""
    exported, known_operations = exported_metrics(), operations()
    with open(path) as f:
        by = {r.get("alert"): r for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
    expect(set(by) == set(ALERTS), f"the alerts are {sorted(ALERTS)}, not {sorted(by)}")
    for name, rule in by.items():
        metric, labels = ALERTS.get(name, ("", ()))
        names = metric_names(rule["expr"])
        expect(names and names <= exported, f"{name}: {sorted(names - exported)} are not metrics the driver exports (in {rule['expr']!r})")
        expect(metric in names, f"{name} reads {metric}")
        for operation in re.findall(r'operation="(\w+)"', rule["expr"]):
            expect(operation in known_operations, f"{name}: operation {operation} is not one packages/metrics counts ({sorted(known_operations)})")
        annotations = rule.get("annotations") or {}
        expect(annotations.get("summary") and annotations.get("description"), f"{name} has a summary and a description")
        for label in labels:
            expect("{{ $labels.%s }}" % label in annotations.get("description", ""), f"{name}'s description names the {label} label")
        expect(rule.get("labels", {}).get("severity") in ("warning", "critical"), f"{name} has a severity")
    expect(by.get("GitCsiVolumeAbnormal", {}).get("for") == "10m", "GitCsiVolumeAbnormal fires after ten minutes (for: 10m)")

def check_examples():
    docs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "examples", "homeassistant", "*.yaml"))):
        docs += load(path)
    by = lambda kind: [d for d in docs if d["kind"] == kind]
    pv = by("PersistentVolume")
    if expect(len(pv) == 1, "one PersistentVolume"):
        s = pv[0]["spec"]
        expect(s["accessModes"] == ["ReadWriteOncePod"], "the PV is ReadWriteOncePod")
        expect(s["csi"]["driver"] == DRIVER and set(s["csi"]["volumeAttributes"]) == {"url", "ref"}, "the PV names the driver, url and ref")
        expect(s["csi"].get("nodeStageSecretRef") == s["csi"].get("nodePublishSecretRef") and s["csi"].get("nodeStageSecretRef"), "the PV names one Secret in both references")
    pvc = by("PersistentVolumeClaim")
    if expect(len(pvc) == 1, "one claim"):
        expect(pvc[0]["spec"]["volumeName"] == pv[0]["metadata"]["name"] if pv else False, "the claim names the volume")
        expect("volumeAttributesClassName" not in pvc[0]["spec"], "the claim names no class until it is bound")
    vac = by("VolumeAttributesClass")
    if expect(len(vac) == 1, "one VolumeAttributesClass"):
        expect(vac[0]["apiVersion"] == "storage.k8s.io/v1" and vac[0]["driverName"] == DRIVER, "the class is storage.k8s.io/v1 for the driver")
        expect(set(vac[0]["parameters"]) == {"push.quiesce", "push.maxLatency", "commit.maxFileSize", "commit.author", "ignore"}, "the class has spec 004's parameters")
    sec = by("Secret")
    expect(len(sec) == 1 and sec[0]["type"] == "kubernetes.io/ssh-auth" and "ssh-privatekey" in sec[0].get("stringData", {}), "an ssh-auth Secret with ssh-privatekey")
    dep = by("Deployment")
    if expect(len(dep) == 1, "one Deployment"):
        expect(dep[0]["spec"].get("strategy", {}).get("type") == "Recreate", "the Deployment uses strategy: Recreate")
        claims = [v["persistentVolumeClaim"]["claimName"] for v in dep[0]["spec"]["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v]
        expect(pvc and claims == [pvc[0]["metadata"]["name"]], "the Deployment mounts the claim")

what = sys.argv[1]
if what == "render":
    check_render(sys.argv[2], service_monitor=sys.argv[3] == "servicemonitor", sidecars=sys.argv[3] == "sidecars", prometheus_rule=sys.argv[3] == "prometheusrule",
                 delete_fenced_pods=sys.argv[3] != "nodelete", provisioner_secrets=sys.argv[3] == "provisionersecrets", snapshots=sys.argv[3] == "snapshots")
elif what == "rules":
    check_rules(sys.argv[2])
elif what == "dashboard":
    check_dashboard()
elif what == "examples":
    check_examples()
for p in problems:
    print(f"not ok: {p}")
sys.exit(1 if problems else 0)
PY
export ROOT

# Renders the chart into OUT and checks the manifests: template_ok OUT MODE [helm flags...]
template_ok() {
  local out=$1 mode=$2
  shift 2
  "$HELM" template git-csi "$CHART" --namespace git-csi --kube-version "$KUBE_VERSION" "$@" >"$out" &&
    python3 "$WORK/checks.py" render "$out" "$mode"
}

# A bad value must fail, and fail on the schema, not on something else.
rejects() { # rejects DESCRIPTION helm-flags...
  local what=$1
  shift
  if "$HELM" template git-csi "$CHART" --kube-version "$KUBE_VERSION" "$@" >"$WORK/bad.yaml" 2>"$WORK/bad.err"; then
    echo "helm template accepted $what"
    return 1
  fi
  cat "$WORK/bad.err"
  grep -qi "schema" "$WORK/bad.err"
}

check "helm lint" "$HELM" lint "$CHART" --kube-version "$KUBE_VERSION"
check "helm lint --strict" "$HELM" lint --strict "$CHART" --kube-version "$KUBE_VERSION"
check "helm template (defaults) parses and has the driver's objects" template_ok "$WORK/default.yaml" default
check "helm template (ServiceMonitor on) parses and has the ServiceMonitor" template_ok "$WORK/sm.yaml" servicemonitor \
  --set metrics.serviceMonitor.enabled=true --set-string metrics.serviceMonitor.labels.release=prometheus
check "helm template (registrar and livenessprobe sidecars) parses and runs them" template_ok "$WORK/sidecars.yaml" sidecars \
  --set node.registration=node-driver-registrar --set node.health=livenessprobe
check "helm template (node.deleteFencedPods=false) renders neither the flag's true nor the pods rule" template_ok "$WORK/nodelete.yaml" nodelete \
  --set node.deleteFencedPods=false
check "helm template (controller.provisionerSecrets=true) grants the provisioner get on secrets and nothing more" template_ok "$WORK/provisionersecrets.yaml" provisionersecrets \
  --set controller.provisionerSecrets=true
# The cluster tests run the sidecars `make cluster-tools` builds in e2e/k8s/csi-provisioner under the chart's image names.
sidecar_pins() {
  local mod="$ROOT/e2e/k8s/csi-provisioner/go.mod" failed=0 pair key want got
  for pair in provisioner=github.com/kubernetes-csi/external-provisioner/v6 snapshotter=github.com/kubernetes-csi/external-snapshotter/v8; do
    key=${pair%%=*}
    want=$(awk -v m="${pair#*=}" '($1 == "require" && $2 == m) { print $3 } $1 == m { print $2 }' "$mod")
    got=$(awk -v k="$key:" '$1 == k { found = 1 } found && $1 == "tag:" { gsub(/"/, "", $2); print $2; exit }' "$CHART/values.yaml")
    echo "images.$key.tag $got, $mod requires $want"
    [ -n "$want" ] && [ "$got" = "$want" ] || failed=1
  done
  return $failed
}
check "the chart's csi-provisioner and csi-snapshotter tags are the versions e2e/k8s/csi-provisioner/go.mod builds" sidecar_pins
SNAPSHOT_API=(--api-versions snapshot.storage.k8s.io/v1/VolumeSnapshotClass)
check "helm template (an API server with snapshot.storage.k8s.io/v1) runs csi-snapshotter, its RBAC and a VolumeSnapshotClass" template_ok "$WORK/snapshots-auto.yaml" snapshots \
  "${SNAPSHOT_API[@]}"
check "helm template (snapshots.enabled=true, no snapshot API known) runs csi-snapshotter" template_ok "$WORK/snapshots-on.yaml" snapshots \
  --set snapshots.enabled=true
# A private repository's snapshots: the class names the Secret the csi-snapshotter passes to CreateSnapshot.
class_parameters() {
  local key='snapshots.volumeSnapshotClass.parameters.csi\.storage\.k8s\.io/snapshotter-secret'
  "$HELM" template git-csi "$CHART" --namespace git-csi --kube-version "$KUBE_VERSION" "${SNAPSHOT_API[@]}" \
    --set-string "$key-name=repo-key" --set-string "$key-namespace=home" >"$WORK/class-parameters.yaml" &&
    python3 -c '
import sys, yaml
classes = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "VolumeSnapshotClass"]
want = {"csi.storage.k8s.io/snapshotter-secret-name": "repo-key", "csi.storage.k8s.io/snapshotter-secret-namespace": "home"}
print(classes[0].get("parameters"))
sys.exit(0 if len(classes) == 1 and classes[0].get("parameters") == want else 1)' "$WORK/class-parameters.yaml"
}
check "helm template (snapshots.volumeSnapshotClass.parameters) puts the snapshotter's Secret in the VolumeSnapshotClass" class_parameters
check "helm template (snapshots.enabled=false beside snapshot.storage.k8s.io/v1) runs no csi-snapshotter" template_ok "$WORK/snapshots-off.yaml" default \
  "${SNAPSHOT_API[@]}" --set snapshots.enabled=false
check "helm template (PrometheusRule on) parses and has the PrometheusRule" template_ok "$WORK/rules-on.yaml" prometheusrule \
  --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.namespace=monitoring --set-string metrics.prometheusRule.labels.release=prometheus

# The alert rules exactly as the chart renders them ($WORK/rules.yaml, the
# PrometheusRule's spec): what they read and say, promtool's check, and its
# unit tests (charts/rules.test.yaml, beside the rules.yaml it names).
# Without promtool these fail, never skip.
promtool_rules() { # promtool_rules check|test
  command -v promtool >/dev/null || { echo "no promtool: Debian's prometheus package ('make apt')"; return 1; }
  if [ "$1" = check ]; then
    promtool check rules "$WORK/rules.yaml"
  else
    cp "$ROOT/charts/rules.test.yaml" "$WORK/rules.test.yaml" && promtool test rules "$WORK/rules.test.yaml"
  fi
}
check "the rendered alert rules read exported metrics and their annotations name the claim or node" python3 "$WORK/checks.py" rules "$WORK/rules.yaml"
check "promtool check rules on the rendered rules" promtool_rules check
check "promtool test rules: each alert fires when charts/rules.test.yaml says" promtool_rules test
# A helm upgrade of the csi-frontend and git-worker (images and every value of
# theirs) must not restart the mount-owner: its DaemonSet renders byte for byte
# as before, while the node DaemonSet does change.
FRONTEND_AND_WORKER=(--set images.csiFrontend.tag=9.9.9 --set images.gitWorker.tag=9.9.9 --set images.csiFrontend.pullPolicy=Always
  --set node.metricsPort=9870 --set node.healthPort=9809 --set node.registration=node-driver-registrar --set node.health=livenessprobe
  --set node.updateStrategy.rollingUpdate.maxUnavailable=2 --set node.terminationGracePeriodSeconds=120 --set-string node.podLabels.rollout=b
  --set node.resources.csiFrontend.limits.memory=1Gi --set node.resources.gitWorker.limits.memory=2Gi --set node.resources.fdKeeper.limits.memory=16Mi)
render_only() { # render_only TEMPLATE OUT [helm flags...]
  local template=$1 out=$2
  shift 2
  "$HELM" template git-csi "$CHART" --namespace git-csi --kube-version "$KUBE_VERSION" --show-only "templates/$template" "$@" >"$out"
}
unchanged_by_upgrade() {
  render_only mount-owner-daemonset.yaml "$WORK/owner-before.yaml" &&
    render_only mount-owner-daemonset.yaml "$WORK/owner-after.yaml" "${FRONTEND_AND_WORKER[@]}" &&
    cmp "$WORK/owner-before.yaml" "$WORK/owner-after.yaml" &&
    render_only node-daemonset.yaml "$WORK/node-before.yaml" &&
    render_only node-daemonset.yaml "$WORK/node-after.yaml" "${FRONTEND_AND_WORKER[@]}" &&
    ! cmp -s "$WORK/node-before.yaml" "$WORK/node-after.yaml" &&
    render_only mount-owner-daemonset.yaml "$WORK/owner-new-image.yaml" --set images.mountOwner.tag=9.9.9 &&
    ! cmp -s "$WORK/owner-before.yaml" "$WORK/owner-new-image.yaml" &&
    echo "mount-owner DaemonSet: $(wc -c <"$WORK/owner-before.yaml") bytes, identical after the upgrade; the node DaemonSet changed"
}
check "an upgrade of csi-frontend and git-worker leaves the mount-owner DaemonSet byte for byte as it was" unchanged_by_upgrade
check "values.schema.json rejects a registration it does not know" rejects "node.registration=self" --set node.registration=self
check "values.schema.json rejects node.metricsPort=notanumber" rejects "node.metricsPort=notanumber" --set node.metricsPort=notanumber
check "values.schema.json rejects an owner ref retention that is no Go duration (30d)" rejects "node.ownerRefRetention=30d" --set node.ownerRefRetention=30d
check "values.schema.json rejects a node.deleteFencedPods that is no boolean" rejects "node.deleteFencedPods=yes" --set-string node.deleteFencedPods=yes
check "values.schema.json rejects snapshots.enabled=maybe" rejects "snapshots.enabled=maybe" --set snapshots.enabled=maybe
check "values.schema.json rejects a deletionPolicy Kubernetes does not know" rejects "deletionPolicy=Keep" --set snapshots.volumeSnapshotClass.deletionPolicy=Keep
check "values.schema.json rejects an unknown value (node.metricPort)" rejects "node.metricPort=9000" --set node.metricPort=9000
check "values.schema.json rejects a mount-owner update strategy it does not know" rejects "mountOwner.updateStrategy.type=Sometimes" --set mountOwner.updateStrategy.type=Sometimes
# The driver's three images come from images.registry, the sidecars from their own.
driver_images_from_registry() {
  "$HELM" template git-csi "$CHART" --namespace git-csi --kube-version "$KUBE_VERSION" --set images.registry=registry.example.com:5000/team \
    --set node.registration=node-driver-registrar >"$WORK/registry.yaml" || return 1
  local images
  images=$(grep -o 'image: .*' "$WORK/registry.yaml" | sort -u)
  echo "$images"
  for service in csi-frontend mount-owner git-worker; do
    grep -qx "image: registry.example.com:5000/team/git-csi/$service:0.1.0" <<<"$images" || return 1
  done
  ! grep -v -e 'registry.example.com:5000/team/git-csi/' -e 'registry.k8s.io/sig-storage/' <<<"$images" | grep -q .
}
check "images.registry names where the three driver images are pulled from" driver_images_from_registry
check "values.schema.json rejects a registry with a scheme" rejects "images.registry=https://registry.example.com" --set images.registry=https://registry.example.com
check "values.schema.json rejects an unknown PrometheusRule value (metrics.prometheusRule.enable)" rejects "metrics.prometheusRule.enable=true" --set metrics.prometheusRule.enable=true
check "values.schema.json rejects an image pull policy it does not know" rejects "images.csiFrontend.pullPolicy=Sometimes" --set images.csiFrontend.pullPolicy=Sometimes
check "dashboard names only metrics the driver exports" python3 "$WORK/checks.py" dashboard
check "docs/examples/homeassistant matches spec 004" python3 "$WORK/checks.py" examples

if [ "$FAILED" -gt 0 ]; then
  printf 'failed: %s\n' "${FAILURES[@]}"
fi
echo "chart: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
