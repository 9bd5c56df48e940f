import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as path from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { startDriver } from "../src/driver";

const run = promisify(execFile);
const root = path.join(__dirname, "..", "..", "..");
const BINS: Record<string, string> = {
  "csi-frontend": "packages/csi-frontend/dist/src/main.js",
  "mount-owner": "packages/mount-owner/dist/src/main.js",
  "git-worker": "packages/git-worker/dist/src/main.js",
};

async function exec(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return run(process.execPath, args, { cwd: root }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (err: { code: number; stdout: string; stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }),
  );
}

for (const [name, bin] of Object.entries(BINS)) {
  test(`${name} --help says what it is and lists its flags; a bad flag is named`, async () => {
    const help = await exec([bin, "--help"]);
    assert.equal(help.code, 0);
    assert.match(help.stdout, new RegExp(`^usage: ${name} \\[flags\\]`));
    assert.match(help.stdout, /--state-dir|--endpoint/);
    const unknown = await exec([bin, "--no-such-flag", "x"]);
    assert.equal(unknown.code, 2);
    assert.match(unknown.stderr, /unknown argument --no-such-flag/);
    const missing = await exec([bin]);
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /--[a-z-]+ is required/);
  });
}

test("git-csi --help lists its commands; standalone --help its flags", async () => {
  const top = await exec(["packages/cli/dist/src/main.js", "--help"]);
  assert.equal(top.code, 0);
  assert.match(top.stderr + top.stdout, /standalone +run the three services/);
  const standalone = await exec(["packages/cli/dist/src/main.js", "standalone", "--help"]);
  assert.equal(standalone.code, 0);
  assert.match(standalone.stdout, /--state-dir[\s\S]*--endpoint[\s\S]*--node-id/);
});

test("a failure to start is one JSON log line and a non-zero exit", async () => {
  const failed = await exec([BINS["git-worker"]!, "--state-dir", "/tmp", "--listen", "unix://relative/socket"]);
  assert.equal(failed.code, 1);
  const line = JSON.parse(failed.stderr.trim().split("\n").pop()!) as Record<string, string>;
  assert.equal(line.level, "error");
  assert.equal(line.service, "git-worker");
  assert.equal(line.operation, "startup");
  assert.match(line.message, /must be an absolute unix socket path/);
});

test("each service logs its start-up and its SIGTERM shutdown as JSON lines", async () => {
  const driver = await startDriver();
  await driver.stop();
  const lines = driver
    .logs()
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, string>);
  for (const service of Object.keys(BINS)) {
    assert.ok(
      lines.some((l) => l.service === service && l.operation === "startup" && l.message === "started"),
      `${service} started`,
    );
    assert.ok(
      lines.some((l) => l.service === service && l.operation === "shutdown" && l.signal === "SIGTERM"),
      `${service} shutting down`,
    );
    assert.ok(
      lines.some((l) => l.service === service && l.operation === "shutdown" && l.message === "stopped"),
      `${service} stopped`,
    );
  }
});

test("csi-frontend names the registration and health flags it refuses", async () => {
  const frontend = [BINS["csi-frontend"]!, "--endpoint", "unix:///tmp/x.sock", "--mount-owner", "unix:///tmp/y.sock", "--node-id", "n"];
  const alone = await exec([...frontend, "--registration-dir", "/registration"]);
  assert.equal(alone.code, 2);
  assert.match(alone.stderr, /--registration-dir and --kubelet-registration-path go together/);
  const relative = await exec([...frontend, "--registration-dir", "/registration", "--kubelet-registration-path", "csi.sock"]);
  assert.equal(relative.code, 2);
  assert.match(relative.stderr, /--kubelet-registration-path csi\.sock must be an absolute path/);
  const controller = await exec([...frontend, "--mode", "controller", "--registration-dir", "/registration", "--kubelet-registration-path", "/var/lib/kubelet/plugins/git.liken.sh/csi.sock"]);
  assert.equal(controller.code, 2);
  assert.match(controller.stderr, /--mode controller does not serve/);
  const health = await exec([...frontend, "--health-address", "9808"]);
  assert.equal(health.code, 2);
  assert.match(health.stderr, /--health-address 9808 must be host:port/);
});
