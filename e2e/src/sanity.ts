// make sanity: csi-sanity, the CSI conformance client built from the official
// generated code, against the three real services and a real git server.
import { spawn } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { startDriver } from "./driver";
import { startGitDaemon } from "./git-server";

async function main(): Promise<number> {
  const server = await startGitDaemon();
  const driver = await startDriver({ nodeId: "sanity-node" });
  try {
    await server.createRepo("sanity.git", { files: { "README.md": "csi-sanity\n", "config/app.yaml": "a: 1\n" } });
    const files = {
      parameters: path.join(driver.dir, "parameters.yaml"),
      mutable: path.join(driver.dir, "mutable-parameters.yaml"),
    };
    // A branch per volume: csi-sanity's restore and clone cases make a new branch, which a shared ref cannot be.
    await fs.writeFile(files.parameters, `url: ${server.url("sanity.git")}\nref: sanity/\${pv.metadata.name}\n`);
    await fs.writeFile(files.mutable, `push.quiesce: 5s\npush.maxLatency: 1m\n`);
    const args = [
      `-csi.endpoint=${driver.endpoint}`,
      `-csi.stagingdir=${path.join(driver.dir, "sanity-staging")}`,
      `-csi.mountdir=${path.join(driver.dir, "sanity-mount")}`,
      `-csi.testvolumeparameters=${files.parameters}`,
      `-csi.testvolumemutableparameters=${files.mutable}`,
      "-ginkgo.no-color",
    ];
    const code = await new Promise<number>((resolve, reject) => {
      const sanity = spawn("csi-sanity", args, { stdio: "inherit" });
      sanity.once("exit", (c) => resolve(c ?? 1));
      // Not on PATH outside make (which builds it into .cache/bin): fail, and let the finally stop the driver.
      sanity.once("error", (err) => reject(new Error(`csi-sanity could not run (make sanity builds it and puts it on PATH): ${err.message}`)));
    });
    if (code !== 0) process.stderr.write(`csi-sanity failed; the services logged:\n${driver.logs()}\n`);
    return code;
  } finally {
    await driver.stop();
    await server.stop();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`sanity: ${String(err)}\n`);
    process.exit(1);
  },
);
