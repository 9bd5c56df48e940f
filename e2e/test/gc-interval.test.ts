import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { waitFor } from "../src/driver";
import { runGit } from "../src/git-server";

const WORKER = path.join(__dirname, "..", "..", "..", "packages", "git-worker", "dist", "src", "main.js");

test("the git worker collects its store on its interval: a bare repository no tree names goes", async () => {
  const stateDir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-gc-"));
  const orphan = path.join(stateDir, "repos", "0123456789abcdef.git");
  await runGit(["init", "--bare", "--quiet", orphan]);
  const worker = spawn(process.execPath, [WORKER, "--state-dir", stateDir, "--listen", `unix://${path.join(stateDir, "worker.sock")}`, "--gc-interval", "1s"], { stdio: ["ignore", "ignore", "pipe"] });
  let logs = "";
  worker.stderr.on("data", (c: Buffer) => (logs += c.toString()));
  try {
    await waitFor(
      "the orphaned repository removed",
      async () =>
        !(await fs.stat(orphan).then(
          () => true,
          () => false,
        )),
      15_000,
    );
    assert.match(logs, /removed the bare repository [^"]*0123456789abcdef\.git: no work tree or read-only volume follows it/);
  } finally {
    worker.kill("SIGTERM");
    await new Promise((r) => worker.once("exit", r));
    await fs.rm(stateDir, { recursive: true, force: true });
  }
});

test("an owner ref retention that is no duration stops the git worker before it serves, naming the flag", async () => {
  const stateDir = await fs.mkdtemp(path.join(os.tmpdir(), "git-csi-gc-"));
  try {
    const worker = spawn(process.execPath, [WORKER, "--state-dir", stateDir, "--listen", `unix://${path.join(stateDir, "worker.sock")}`, "--owner-ref-retention", "30d"], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    worker.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    const code = await new Promise((r) => worker.once("exit", r));
    assert.equal(code, 2);
    assert.match(stderr, /--owner-ref-retention "30d" must be a positive duration/);
  } finally {
    await fs.rm(stateDir, { recursive: true, force: true });
  }
});
