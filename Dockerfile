# syntax=docker/dockerfile:1
# The driver's three images, one target each. Build from the repository root:
#   docker build --target csi-frontend -t git-csi/csi-frontend .
#   docker build --target mount-owner -t git-csi/mount-owner .
#   docker build --target git-worker -t git-csi/git-worker .
# e2e/src/images.ts reads each target's stage to make the test clusters'
# images without Docker: keep to the instructions it knows.

FROM node:20-bookworm AS build
# protoc and the well-known .proto files: @git-csi/protos generates its
# TypeScript at build time. libfuse3-dev and pkg-config: the mount owner's
# FUSE server addon (native/), compiled against this image's Node headers
# (/usr/local/include/node).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev libfuse3-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
RUN npm install -g pnpm@10.34.9
ENV CI=true
WORKDIR /src
COPY . .
RUN --mount=type=cache,id=pnpm-store,target=/root/.local/share/pnpm/store \
    pnpm install --frozen-lockfile
# The three packages and the workspace packages they reference (tsc -b
# follows the tsconfig references), once for every target.
RUN pnpm --filter @git-csi/protos run generate \
 && make -C packages/mount-owner/native \
 && make -C packages/git-worker/native \
 && pnpm exec tsc -b packages/csi-frontend packages/mount-owner packages/git-worker
# Each package with its production dependencies only, workspace packages
# copied in, the addon in the mount owner's dist. No install script runs:
# @parcel/watcher ships its linux-x64 prebuild. --legacy: pnpm 10's default
# deploy needs inject-workspace-packages.
RUN --mount=type=cache,id=pnpm-store,target=/root/.local/share/pnpm/store \
    pnpm deploy --filter @git-csi/csi-frontend --prod --legacy /out/csi-frontend \
 && pnpm deploy --filter @git-csi/mount-owner --prod --legacy /out/mount-owner \
 && pnpm deploy --filter @git-csi/git-worker --prod --legacy /out/git-worker

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
USER root
ENTRYPOINT ["/usr/bin/tini", "--", "node", "/app/dist/src/main.js"]
