import assert from "node:assert/strict";
import { test } from "node:test";
import { parseDockerfile, recipeOf } from "../src/images";

/**
 * The images the cluster tests run are made from the Dockerfiles themselves
 * (e2e/src/images.ts): each Dockerfile's final stage is read, and a line the
 * builder cannot follow fails the build instead of being left out.
 */
test("each Dockerfile's final stage is the recipe the test images are made from", () => {
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
});

test("a Dockerfile line the image builder does not follow fails, naming the line", () => {
  const dockerfile = (final: string) => `FROM node:20-bookworm AS build\nRUN pnpm deploy --filter @git-csi/x --prod --legacy /out\nFROM node:20-bookworm-slim\n${final}\nENTRYPOINT ["node"]\n`;
  assert.throws(() => parseDockerfile("x", dockerfile("VOLUME /data"), "x/Dockerfile"), /x\/Dockerfile: the image builder does not know the final stage's 'VOLUME \/data'/);
  assert.throws(() => parseDockerfile("x", dockerfile("COPY extra /extra"), "x/Dockerfile"), /COPY extra \/extra/);
  assert.throws(() => parseDockerfile("x", dockerfile("").replace("node:20-bookworm-slim", "alpine:3"), "x/Dockerfile"), /base alpine:3 is not one of node:20-bookworm-slim/);
  assert.equal(
    parseDockerfile("x", dockerfile("RUN apt-get update && apt-get install -y --no-install-recommends git tini && rm -rf /var/lib/apt/lists/*"), "x/Dockerfile").packages.join(" "),
    "git tini",
  );
});
