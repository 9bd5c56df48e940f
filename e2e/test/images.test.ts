import assert from "node:assert/strict";
import { test } from "node:test";
import { parseDockerfile, recipeOf } from "../src/images";

/**
 * The images the cluster tests run are made from the Dockerfile itself
 * (e2e/src/images.ts): each image's target stage is read, and a line the
 * builder cannot follow fails the build instead of being left out.
 */
test("each target of the Dockerfile is the recipe the test images are made from", () => {
  const frontend = recipeOf("csi-frontend");
  assert.deepEqual(
    [frontend.deploy, frontend.base, frontend.packages, frontend.user, frontend.entrypoint],
    ["@git-csi/csi-frontend", "node:20-bookworm-slim", [], "node", ["node", "/app/dist/src/main.js"]],
  );
  const owner = recipeOf("mount-owner");
  assert.ok(owner.packages.includes("fuse3") && owner.user === "root", `mount-owner: ${JSON.stringify(owner)}`);
  const worker = recipeOf("git-worker");
  assert.ok(
    ["git", "openssh-client", "ca-certificates", "tini"].every((p) => worker.packages.includes(p)),
    `git-worker: ${JSON.stringify(worker)}`,
  );
  assert.deepEqual(worker.entrypoint, ["/usr/bin/tini", "--", "node", "/app/dist/src/main.js"]);
  for (const r of [frontend, owner, worker]) assert.deepEqual([r.env, r.workdir], [{ NODE_ENV: "production" }, "/app"]);
  // One build stage deploys each package to the directory its target copies.
  assert.deepEqual([owner.deploy, worker.deploy], ["@git-csi/mount-owner", "@git-csi/git-worker"]);
});

test("a Dockerfile line the image builder does not follow fails, naming the line", () => {
  const dockerfile = (final: string) =>
    `FROM node:20-bookworm AS build\nRUN pnpm deploy --filter @git-csi/y --prod --legacy /out/y && pnpm deploy --filter @git-csi/x --prod --legacy /out/x\nFROM node:20-bookworm-slim AS x\nCOPY --from=build /out/x /app\n${final}\nENTRYPOINT ["node"]\n`;
  assert.equal(parseDockerfile("x", dockerfile(""), "x/Dockerfile").deploy, "@git-csi/x");
  // A target on a stage of the file takes that stage's settings, and may change them.
  const onRuntime = dockerfile("USER node").replace("FROM node:20-bookworm-slim AS x", "FROM node:20-bookworm-slim AS runtime\nENV NODE_ENV=production\nWORKDIR /app\nUSER root\nFROM runtime AS x");
  const x = parseDockerfile("x", onRuntime, "x/Dockerfile");
  assert.deepEqual([x.base, x.env, x.workdir, x.user], ["node:20-bookworm-slim", { NODE_ENV: "production" }, "/app", "node"]);
  assert.throws(() => parseDockerfile("x", dockerfile("VOLUME /data"), "x/Dockerfile"), /x\/Dockerfile: the image builder does not know target x's 'VOLUME \/data'/);
  assert.throws(() => parseDockerfile("x", dockerfile("COPY extra /extra"), "x/Dockerfile"), /COPY extra \/extra/);
  assert.throws(() => parseDockerfile("x", dockerfile("").replace("node:20-bookworm-slim", "alpine:3"), "x/Dockerfile"), /base alpine:3 is not one of node:20-bookworm-slim/);
  assert.equal(
    parseDockerfile("x", dockerfile("RUN apt-get update && apt-get install -y --no-install-recommends git tini && rm -rf /var/lib/apt/lists/*"), "x/Dockerfile").packages.join(" "),
    "git tini",
  );
  assert.throws(() => parseDockerfile("z", dockerfile(""), "x/Dockerfile"), /x\/Dockerfile: no target z \(FROM … AS z\)/);
  assert.throws(() => parseDockerfile("x", dockerfile("").replace("/out/x /app", "/out/z /app"), "x/Dockerfile"), /no 'pnpm deploy --filter <package> … \/out\/z'/);
});
