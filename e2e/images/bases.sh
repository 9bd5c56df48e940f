#!/usr/bin/env bash
# The public images the Dockerfile and the tests name, made on a machine that
# reaches no public image registry (CI, this project's machines), and given
# their public names in the builder's store so `buildah bud` never pulls:
#
#   docker.io/library/node:20-bookworm-slim  debootstrap's Debian bookworm
#       (minbase, slimmed as the official image is) with this machine's Node.js
#       at /usr/local, as the official image lays it out, and its node user
#   docker.io/library/busybox:1.36           Debian's static busybox, for the
#       tests' and the quick start's application pods
#   <ref>=<binary> arguments                 one static binary each, at
#       /<name> and its entrypoint: the CSI sidecars and the pause image,
#       which `make cluster-tools` builds from their Go modules and source
#
# Each is made again only when what it is made from changed (a key in its
# annotations). Usage: BUILDAH="buildah --root …" bases.sh <cache dir> [<ref>=<binary>…]
set -euo pipefail
cache=$1
read -r -a buildah <<<"${BUILDAH:-buildah}"

NODE_IMAGE=docker.io/library/node:20-bookworm-slim
BUSYBOX_IMAGE=docker.io/library/busybox:1.36
MIRROR=http://deb.debian.org/debian

# $(key "FUNCTIONS" WHAT…): what an image is made from, hashed with the
# functions that make it, so an edit elsewhere here remakes nothing.
key() {
	local functions=$1
	shift
	# shellcheck disable=SC2086
	{ declare -f $functions; printf '%s\n' "$@"; } | sha256sum | cut -c1-16
}

# True when the image is in the store and was made from the same inputs.
current() {
	[ "$("${buildah[@]}" inspect --type image --format '{{index .ImageAnnotations "sh.liken.base-key"}}' "$1" 2>/dev/null)" = "$2" ]
}

# The Debian root file system, made once: debootstrap takes about a minute.
rootfs_tar() {
	local tar=$cache/bookworm-minbase.tar
	if [ ! -f "$tar" ]; then
		local dir start=$SECONDS
		dir=$(mktemp -d "$cache/debootstrap.XXXXXX")
		echo "debootstrap bookworm (minbase) from $MIRROR" >&2
		debootstrap --variant=minbase bookworm "$dir" "$MIRROR" >"$cache/debootstrap.log" 2>&1 ||
			{ tail -20 "$cache/debootstrap.log" >&2; exit 1; }
		tar -C "$dir" --numeric-owner -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
		rm -rf "$dir"
		echo "made the Debian root file system in $((SECONDS - start)) s" >&2
	fi
	echo "$tar"
}

# The official slim images' dpkg exclusions, the node user, and empty caches.
slim() {
	local root=$1
	cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<-'EOF'
		path-exclude /usr/share/doc/*
		path-include /usr/share/doc/*/copyright
		path-exclude /usr/share/man/*
		path-exclude /usr/share/info/*
		path-exclude /usr/share/locale/*
	EOF
	find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete
	rm -rf "$root"/usr/share/{man,info,locale}/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
	chroot "$root" groupadd --gid 1000 node
	chroot "$root" useradd --uid 1000 --gid node --shell /bin/bash --create-home node
}

# This machine's Node.js (the nodejs package), at /usr/local as in the official image.
add_node() {
	local root=$1
	mkdir -p "$root/usr/local/bin" "$root/usr/local/include" "$root/usr/local/lib/node_modules"
	cp -a /usr/bin/node "$root/usr/local/bin/node"
	cp -a /usr/include/node "$root/usr/local/include/node"
	cp -a /usr/lib/node_modules/npm /usr/lib/node_modules/corepack "$root/usr/local/lib/node_modules/"
	ln -s ../lib/node_modules/npm/bin/npm-cli.js "$root/usr/local/bin/npm"
	ln -s ../lib/node_modules/npm/bin/npx-cli.js "$root/usr/local/bin/npx"
	ln -s ../lib/node_modules/corepack/dist/corepack.js "$root/usr/local/bin/corepack"
}

node_image() {
	local tar version npm k
	tar=$(rootfs_tar)
	version=$(node --version)
	npm=$(node -p 'require("/usr/lib/node_modules/npm/package.json").version')
	k=$(key "node_image slim add_node" "$(sha256sum <"$tar")" "$version" "$npm")
	if current "$NODE_IMAGE" "$k"; then return; fi
	local start=$SECONDS ctr root
	ctr=$("${buildah[@]}" from scratch)
	root=$("${buildah[@]}" mount "$ctr")
	tar -C "$root" --numeric-owner -xf "$tar"
	slim "$root"
	add_node "$root"
	"${buildah[@]}" umount "$ctr" >/dev/null
	"${buildah[@]}" config --env "NODE_VERSION=${version#v}" --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--cmd node --annotation "sh.liken.base-key=$k" "$ctr"
	"${buildah[@]}" commit -q --rm "$ctr" "$NODE_IMAGE" >/dev/null
	echo "made $NODE_IMAGE (Node.js $version) in $((SECONDS - start)) s" >&2
}

busybox_image() {
	local k ctr root start=$SECONDS
	k=$(key busybox_image "$(sha256sum </bin/busybox)")
	if current "$BUSYBOX_IMAGE" "$k"; then return; fi
	ctr=$("${buildah[@]}" from scratch)
	root=$("${buildah[@]}" mount "$ctr")
	mkdir -p "$root/bin" "$root/tmp"
	chmod 1777 "$root/tmp"
	cp /bin/busybox "$root/bin/busybox"
	for applet in $(/bin/busybox --list); do [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"; done
	"${buildah[@]}" umount "$ctr" >/dev/null
	"${buildah[@]}" config --env PATH=/bin --cmd sh --annotation "sh.liken.base-key=$k" "$ctr"
	"${buildah[@]}" commit -q --rm "$ctr" "$BUSYBOX_IMAGE" >/dev/null
	echo "made $BUSYBOX_IMAGE in $((SECONDS - start)) s" >&2
}

binary_image() {
	local ref=$1 binary=$2 k ctr start=$SECONDS
	k=$(key binary_image "$(sha256sum <"$binary")")
	if current "$ref" "$k"; then return; fi
	ctr=$("${buildah[@]}" from scratch)
	"${buildah[@]}" copy --chmod 0755 "$ctr" "$binary" "/$(basename "$binary")" >/dev/null
	"${buildah[@]}" config --entrypoint "[\"/$(basename "$binary")\"]" --annotation "sh.liken.base-key=$k" "$ctr"
	"${buildah[@]}" commit -q --rm "$ctr" "$ref" >/dev/null
	echo "made $ref in $((SECONDS - start)) s" >&2
}

mkdir -p "$cache"
node_image
busybox_image
for image in "${@:2}"; do binary_image "${image%%=*}" "${image#*=}"; done
