#!/usr/bin/env bash
# `make publish REGISTRY=… [VERSION=…] [PLAIN_HTTP=1]`: the driver's images,
# as `make images` built them, to $REGISTRY/git-csi/<service>:$VERSION, and the
# chart, packaged to name exactly those images at that version, to
# oci://$REGISTRY/charts/git-csi. Credentials come from the usual container
# auth file ($REGISTRY_AUTH_FILE, else ${XDG_RUNTIME_DIR}/containers/auth.json,
# else ~/.docker/config.json), which `skopeo login` and `helm registry login`
# write; PLAIN_HTTP=1 for a registry that speaks plain HTTP.
set -euo pipefail
: "${REGISTRY:?}" "${VERSION:?}" "${SERVICES:?}" "${STORE:?}" "${HELM:?}"
cd "$(dirname "$0")/.."

auth_file() {
	local f
	for f in "${REGISTRY_AUTH_FILE:-}" "${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/containers/auth.json" "$HOME/.docker/config.json"; do
		if [ -n "$f" ] && [ -f "$f" ]; then echo "$f"; return; fi
	done
}

auth=$(auth_file)
skopeo_flags=() helm_flags=()
if [ -n "$auth" ]; then skopeo_flags+=(--authfile "$auth") helm_flags+=(--registry-config "$auth"); fi
if [ "${PLAIN_HTTP:-}" = 1 ]; then skopeo_flags+=(--dest-tls-verify=false) helm_flags+=(--plain-http); fi

for service in $SERVICES; do
	ref=$REGISTRY/git-csi/$service:$VERSION
	start=$SECONDS
	skopeo copy --quiet "${skopeo_flags[@]}" "containers-storage:[$STORE]$ref" "docker://$ref"
	echo "pushed $ref in $((SECONDS - start)) s"
done

# The chart as it ships, but naming this registry and version: Chart.yaml's
# version and appVersion (helm package), and values.yaml's images.registry.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -a charts/git-csi "$work/git-csi"
registry_line='^  registry: ghcr.io/liken-sh$'
grep -q "$registry_line" "$work/git-csi/values.yaml" || { echo "charts/git-csi/values.yaml: no line '  registry: ghcr.io/liken-sh' under images to set" >&2; exit 1; }
sed -i "s|$registry_line|  registry: $REGISTRY|" "$work/git-csi/values.yaml"
"$HELM" package "$work/git-csi" --version "$VERSION" --app-version "$VERSION" --destination "$work" >/dev/null
"$HELM" push "${helm_flags[@]}" "$work/git-csi-$VERSION.tgz" "oci://$REGISTRY/charts"
echo "pushed oci://$REGISTRY/charts/git-csi:$VERSION, naming $REGISTRY/git-csi/{${SERVICES// /,}}:$VERSION"
