import { after, before } from "node:test";
import { type Driver, type DriverOptions, freePort, startDriver } from "./driver";
import { type GitServer, startGitDaemon } from "./git-server";

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
