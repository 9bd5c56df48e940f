# The driver's three images, one target each, from one build stage. Build from
# the repository root with any OCI builder:
#   buildah bud --layers --target csi-frontend -t git-csi/csi-frontend .
#   docker build --target mount-owner -t git-csi/mount-owner .
# `make images` builds all three with buildah, `make publish` pushes them
# (README, "Install"). Three images rather than one: each holds only what its
# container runs, and each runs as the user it needs.

FROM node:20-bookworm-slim AS build
# A C compiler, make and pkg-config with libfuse3-dev: the mount owner's FUSE
# server addon and the two plain programs (native/), compiled against this
# image's Node headers (/usr/local/include/node). protoc and the well-known
# .proto files: @git-csi/protos generates its TypeScript at build time.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev make pkg-config libfuse3-dev protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
# Behind a TLS-intercepting proxy, `make images` passes the host's trust store
# in here (read-only, for the build's RUN lines alone; no image keeps it).
ARG NODE_EXTRA_CA_CERTS
RUN npm install -g pnpm@10.34.9
ENV CI=true
WORKDIR /src
# The dependencies from the lockfile alone, so a change of source reuses this layer.
COPY pnpm-lock.yaml pnpm-workspace.yaml ./
RUN pnpm fetch
COPY . .
RUN pnpm install --offline --frozen-lockfile
# The three packages and the workspace packages they reference (tsc -b
# follows the tsconfig references), once for every target.
RUN pnpm --filter @git-csi/protos run generate \
 && make -C packages/mount-owner/native \
 && make -C packages/git-worker/native \
 && pnpm exec tsc -b packages/csi-frontend packages/mount-owner packages/git-worker
# Each package with its production dependencies only, workspace packages
# copied in, the native programs in its dist. No install script runs:
# @parcel/watcher ships its linux-x64 prebuild. --legacy: pnpm 10's default
# deploy needs inject-workspace-packages.
RUN pnpm deploy --filter @git-csi/csi-frontend --prod --legacy /out/csi-frontend \
 && pnpm deploy --filter @git-csi/mount-owner --prod --legacy /out/mount-owner \
 && pnpm deploy --filter @git-csi/git-worker --prod --legacy /out/git-worker \
 && chmod +x /out/git-worker/dist/src/git-csi.js

# What every image shares: the slim Node.js base, production mode, /app.
FROM node:20-bookworm-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app

# Runs as the unprivileged `node` user (uid 1000) by default: it only serves
# and dials unix sockets. The Helm chart's node plugin runs it as uid 0 with
# every capability dropped, because there its sockets are in root-owned host
# directories (the kubelet's plugin directory, the state's sockets directory).
FROM runtime AS csi-frontend
COPY --from=build /out/csi-frontend /app
USER node
ENTRYPOINT ["node", "/app/dist/src/main.js"]

# Runs as root, and the Helm chart's node plugin runs it privileged: it
# mounts FUSE at the kubelet's staging paths and bind-mounts them into pod
# targets, and Bidirectional mount propagation is only allowed for a
# privileged container. (The chart's controller runs it as uid 1000: there it
# only keeps records.)
FROM runtime AS mount-owner
# fuse3: libfuse3.so.3, which the addon links, fusermount3 and /etc/fuse.conf; util-linux and mount: mount and umount for
# the bind mounts and for unmounting a dead FUSE connection.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends fuse3 util-linux mount \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/mount-owner /app
USER root
ENTRYPOINT ["node", "/app/dist/src/main.js"]

# Runs as root: on a node it writes the root-owned state hostPath
# (/var/lib/git-csi) and replays the owners and modes the repository records
# onto each work tree, which takes chown. The Helm chart keeps only the
# capabilities that needs (CHOWN, DAC_OVERRIDE, FOWNER, FSETID) and runs the
# controller's copy, which runs no git against a remote, as uid 1000.
FROM runtime AS git-worker
# git; openssh-client: ssh, ssh-agent and ssh-add for ssh remotes;
# ca-certificates: https remotes; tini: reaps the processes git and ssh leave
# behind, which node as PID 1 would not.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends git openssh-client ca-certificates tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/git-worker /app
# `kubectl exec … -c git-worker -- git-csi report <volume>` (README).
RUN ln -s /app/dist/src/git-csi.js /usr/local/bin/git-csi
USER root
ENTRYPOINT ["/usr/bin/tini", "--", "node", "/app/dist/src/main.js"]
