import assert from "node:assert/strict";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { test } from "node:test";
import { fetchBranch, pushCommit } from "../src/remote/remote";
import { ownerRef, Store, upstreamOwnerRef, upstreamRef } from "../src/trees/store";
import { AUTHOR, servedRemote, tempDir } from "./remote";

test("a ref that moves on the server between the client's check and the server's update is a lost compare-and-swap, not a failed push", async (t) => {
  const remote = await servedRemote(t);
  const store = new Store(await tempDir(t, "node"));
  const repo = await store.ensureRepo(remote.url);
  assert.equal(await fetchBranch(repo, "main"), "fetched");
  const base = (await repo.raw(["rev-parse", upstreamRef("main")])).trim();
  const ours = (await repo.env({ ...process.env, GIT_DIR: store.repoDir(remote.url), ...AUTHOR }).raw(["commit-tree", `${base}^{tree}`, "-p", base, "-m", "ours"])).trim();
  // Another writer lands while the push is in flight: the server's hook moves main before receive-pack locks it.
  const racer = remote.git("commit-tree", `${base}^{tree}`, "-p", base, "-m", "racer");
  const hook = path.join(remote.dir, "hooks", "pre-receive");
  await fs.mkdir(path.dirname(hook), { recursive: true });
  await fs.writeFile(hook, `#!/bin/sh\ncat >/dev/null\nenv -u GIT_QUARANTINE_PATH -u GIT_OBJECT_DIRECTORY -u GIT_ALTERNATE_OBJECT_DIRECTORIES git update-ref refs/heads/main ${racer}\n`, {
    mode: 0o755,
  });
  const fence = [{ ref: ownerRef("vol"), expected: "", next: ours, seen: upstreamOwnerRef("vol") }];
  const result = await pushCommit(repo, ours, "main", fence);
  assert.equal(result.outcome, "rejected", "message" in result ? result.message : "");
  assert.match("message" in result ? result.message : "", /cannot lock ref 'refs\/heads\/main'/);
  assert.equal(remote.git("rev-parse", "refs/heads/main"), racer, "the other writer's commit stays");
});
