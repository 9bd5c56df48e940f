import { randomBytes } from "node:crypto";
import * as fs from "node:fs/promises";
import * as net from "node:net";
import * as path from "node:path";

/**
 * Serves https credentials to git's credential helper over a unix socket that
 * only root can reach, for one git operation at a time: each operation gets a
 * random ticket that names its credential and is dropped when it ends.
 */
export class CredentialBroker {
  private readonly tickets = new Map<string, { username: string; password: string }>();
  private server?: net.Server;

  constructor(readonly socketPath: string) {}

  async start(): Promise<void> {
    await fs.mkdir(path.dirname(this.socketPath), { recursive: true });
    await fs.rm(this.socketPath, { force: true });
    this.server = net.createServer((socket) => {
      let line = "";
      socket.on("data", (chunk: Buffer) => {
        line += chunk.toString();
        if (!line.includes("\n")) return;
        const credential = this.tickets.get(line.slice(0, line.indexOf("\n")));
        socket.end(credential ? `username=${credential.username}\npassword=${credential.password}\n` : "");
      });
      socket.on("error", () => socket.destroy());
    });
    await new Promise<void>((resolve, reject) => this.server!.listen(this.socketPath, resolve).once("error", reject));
    await fs.chmod(this.socketPath, 0o600);
  }

  async withTicket<T>(credential: { username: string; password: string }, work: (ticket: string) => Promise<T>): Promise<T> {
    const ticket = randomBytes(24).toString("hex");
    this.tickets.set(ticket, credential);
    try {
      return await work(ticket);
    } finally {
      this.tickets.delete(ticket);
    }
  }

  stop(): void {
    this.server?.close();
  }
}
