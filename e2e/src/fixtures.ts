import { after, before } from "node:test";
import { type Driver, type DriverOptions, freePort, startDriver } from "./driver";
import { type GitServer, startGitDaemon } from "./git-server";

/** A Git LFS pointer, as git-lfs commits it in place of the object it names (its spec v1), and the .gitattributes line that hands *.bin to Git LFS. */
export const LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n";
export const LFS_ATTRIBUTES = "*.bin filter=lfs diff=lfs merge=lfs -text\n";

/**
 * A git daemon and a driver with a metrics listener for the tests of a
 * describe block: started before them, stopped after. started hands both
 * over once they run; options go to the driver (a short lease, say).
 */
export function withDaemonAndDriver(started: (server: GitServer, driver: Driver) => void, options: DriverOptions = {}): void {
  let server: GitServer | undefined;
  let driver: Driver | undefined;
  before(async () => {
    server = await startGitDaemon();
    driver = await startDriver({ metricsPort: await freePort(), ...options });
    started(server, driver);
  });
  after(async () => {
    await driver?.stop();
    await server?.stop();
  });
}
