// Test helper: a REAL git smart-HTTP server: Debian's lighttpd (mod_cgi +
// mod_auth) in front of `git http-backend`, serving bare repositories from a
// private temp dir on 127.0.0.1:<ephemeral port>, behind HTTP basic auth whose
// password is a random token (user "git"). Fetch and push both need it.
//
//   const srv = await startHttpGitServer();
//   await srv.createRepo("demo.git");
//   // git -c http.extraHeader="Authorization: Basic <base64(git:token)>" clone srv.url("demo.git")
//   //   (srv.authHeader() builds that header)
//   const fresh = srv.rotateToken(); // the old token is refused from now on
//   await srv.stop();
//
// lighttpd runs in the foreground (-D) as a child of the test process with its
// own minimal config (no /etc/lighttpd, no :80, error log / pid file / upload
// dir in the temp dir); no system service is involved. Linux only.

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { renameSync, rmSync, writeFileSync } from "node:fs";
import { mkdtemp, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import * as http from "node:http";
import * as os from "node:os";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { bareRepoOps, freePort, gitEnv, killProcessTreeSync, stopProcessTree, type BareRepoOps } from "./git-server";

const LIGHTTPD = "/usr/sbin/lighttpd";
const HTTP_BACKEND = "/usr/lib/git-core/git-http-backend";

export interface HttpGitServer extends BareRepoOps {
  readonly port: number;
  /** PID of lighttpd. */
  readonly pid: number;
  /** Basic-auth user name: "git". */
  readonly username: string;
  /** Current basic-auth password (changes with rotateToken()). */
  readonly token: string;
  /** http://127.0.0.1:<port>/git/<repo> (no credentials in it) */
  url(repo: string): string;
  /** `Authorization: Basic base64(username:token)` for `git -c http.extraHeader=...`; default: the current token. */
  authHeader(token?: string): string;
  /** Replace the token; the old one is refused from the next request on. Returns the new token. */
  rotateToken(): string;
  /** Kill lighttpd and its CGI children, remove the temp dir. Idempotent. */
  stop(): Promise<void>;
}

const SAFE_PATH = /^\/[A-Za-z0-9._/-]+$/;
const USERNAME = "git";

const newToken = () => randomBytes(24).toString("base64url"); // [A-Za-z0-9_-], never ":"

/** GET without credentials; resolves to status + WWW-Authenticate, or undefined on connection errors. */
function probe(port: number): Promise<{ status: number; wwwAuthenticate: string } | undefined> {
  return new Promise((resolve) => {
    const req = http.get({ host: "127.0.0.1", port, path: "/git/", agent: false, timeout: 2_000, headers: { connection: "close" } }, (res) => {
      res.resume();
      resolve({ status: res.statusCode ?? 0, wwwAuthenticate: String(res.headers["www-authenticate"] ?? "") });
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(undefined));
  });
}

export async function startHttpGitServer(): Promise<HttpGitServer> {
  const tmpRoot = await mkdtemp(path.join(os.tmpdir(), "git-csi-httpd-"));
  // the path ends up inside double-quoted lighttpd config strings
  if (!SAFE_PATH.test(tmpRoot)) {
    await rm(tmpRoot, { recursive: true, force: true });
    throw new Error(`temp dir ${JSON.stringify(tmpRoot)} has characters unsafe for lighttpd.conf`);
  }
  const at = pathsUnder(tmpRoot);
  const { baseDir, workDir, userFile, errorLog, configFile } = at;
  const realm = `git-csi-e2e-${randomBytes(6).toString("hex")}`; // unique: the readiness probe knows it hit *this* lighttpd

  let lighttpd: Lighttpd | undefined;
  let users: UserFile;
  let port = 0;
  const onExit = () => {
    // the test process is exiting without stop(): kill everything, drop the temp dir
    if (lighttpd?.child.pid !== undefined && !lighttpd.exited) killProcessTreeSync(lighttpd.child.pid);
    rmSync(tmpRoot, { recursive: true, force: true });
  };
  process.once("exit", onExit);

  try {
    await mkdir(baseDir);
    await mkdir(workDir);
    await mkdir(at.docRoot);
    await mkdir(at.uploadDir, { mode: 0o700 });
    users = new UserFile(userFile);

    for (let attempt = 1; ; attempt++) {
      port = await freePort();
      await writeFile(configFile, lighttpdConfig({ ...at, port, realm }));
      const launched = await launchLighttpd(configFile, port, realm);
      lighttpd = launched.lighttpd;
      if (launched.ready) break;
      await stopProcessTree(lighttpd.child, 500);
      lighttpd = undefined;
      const log = await readFile(errorLog, "utf8").catch(() => "");
      const why = `${launched.stderrTail.trim()}\n${log.trim()}`.trim();
      if (!/Address already in use|can't bind/i.test(why) || attempt >= 5) {
        throw new Error(`lighttpd did not start on 127.0.0.1:${port}: ${why}`);
      }
    }
  } catch (e) {
    process.removeListener("exit", onExit);
    await rm(tmpRoot, { recursive: true, force: true });
    throw e;
  }

  const ops = bareRepoOps(baseDir, workDir);
  const pid = lighttpd!.child.pid as number;
  let stopped = false;
  const server: HttpGitServer = {
    ...ops,
    port,
    pid,
    username: USERNAME,
    get token() {
      return users.token;
    },
    url(repo) {
      ops.repoPath(repo); // validates the name
      return `http://127.0.0.1:${port}/git/${repo}`;
    },
    authHeader(t = users.token) {
      return `Authorization: Basic ${Buffer.from(`${USERNAME}:${t}`).toString("base64")}`;
    },
    rotateToken: () => users.rotate(),
    async stop() {
      if (stopped) return;
      stopped = true;
      if (lighttpd && !lighttpd.exited) await stopProcessTree(lighttpd.child);
      process.removeListener("exit", onExit);
      await rm(tmpRoot, { recursive: true, force: true });
    },
  };
  return server;
}

/** Where the server keeps its files, under its temporary root. */
function pathsUnder(tmpRoot: string) {
  const under = (name: string) => path.join(tmpRoot, name);
  return {
    baseDir: under("repos"),
    workDir: under("work"),
    docRoot: under("htdocs"),
    uploadDir: under("uploads"),
    userFile: under("users"),
    errorLog: under("error.log"),
    configFile: under("lighttpd.conf"),
    pidFile: under("lighttpd.pid"),
  };
}

/** The one user lighttpd's plain backend accepts; it reads the file on every authentication, so the file is replaced atomically. */
class UserFile {
  token = newToken();

  constructor(private readonly file: string) {
    this.write();
  }

  rotate(): string {
    this.token = newToken();
    this.write();
    return this.token;
  }

  private write(): void {
    const tmp = `${this.file}.tmp`;
    writeFileSync(tmp, `${USERNAME}:${this.token}\n`, { mode: 0o600 });
    renameSync(tmp, this.file);
  }
}

/** A lighttpd this server started; exited once it is gone. */
interface Lighttpd {
  child: ChildProcess;
  exited: boolean;
}

/** The private lighttpd's configuration: git http-backend under /git/, basic auth from the users file. */
function lighttpdConfig(at: { port: number; docRoot: string; errorLog: string; pidFile: string; uploadDir: string; userFile: string; realm: string; baseDir: string }): string {
  const q = (s: string) => JSON.stringify(s); // safe: paths are checked against SAFE_PATH
  return [
    "# git-csi e2e: private lighttpd, see e2e/src/http-server.ts",
    `server.modules = ( "mod_access", "mod_alias", "mod_auth", "mod_authn_file", "mod_setenv", "mod_cgi" )`,
    `server.bind = "127.0.0.1"`,
    `server.port = ${at.port}`,
    `server.document-root = ${q(at.docRoot)}`,
    `server.errorlog = ${q(at.errorLog)}`,
    `server.pid-file = ${q(at.pidFile)}`,
    `server.upload-dirs = ( ${q(at.uploadDir)} )`,
    `server.stream-request-body = 2`,
    `server.stream-response-body = 2`,
    `auth.backend = "plain"`,
    `auth.backend.plain.userfile = ${q(at.userFile)}`,
    `auth.require = ( "/git/" => ( "method" => "basic", "realm" => ${q(at.realm)}, "require" => "valid-user" ) )`,
    `alias.url = ( "/git/" => ${q(`${HTTP_BACKEND}/`)} )`,
    `$HTTP["url"] =^ "/git/" {`,
    `  cgi.assign = ( "" => "" )`,
    `  setenv.set-environment = (`,
    `    "GIT_PROJECT_ROOT" => ${q(at.baseDir)},`,
    `    "GIT_HTTP_EXPORT_ALL" => "1",`,
    `    "GIT_CONFIG_NOSYSTEM" => "1",`,
    `    "GIT_CONFIG_GLOBAL" => "/dev/null",`,
    `    "GIT_CONFIG_COUNT" => "1",`,
    `    "GIT_CONFIG_KEY_0" => "http.receivepack",`,
    `    "GIT_CONFIG_VALUE_0" => "true"`,
    `  )`,
    `}`,
    "",
  ].join("\n");
}

/** Starts lighttpd; ready once it answers 401 with this server's realm, not when it exits or after 10 s. */
async function launchLighttpd(configFile: string, port: number, realm: string): Promise<{ lighttpd: Lighttpd; ready: boolean; stderrTail: string }> {
  const child = spawn(LIGHTTPD, ["-D", "-f", configFile], { env: gitEnv(), stdio: ["ignore", "pipe", "pipe"] });
  const lighttpd: Lighttpd = { child, exited: false };
  let stderrTail = "";
  const tail = (b: Buffer) => {
    stderrTail = (stderrTail + b.toString("utf8")).slice(-8192);
  };
  child.stdout?.on("data", tail);
  child.stderr?.on("data", tail);
  child.on("exit", () => (lighttpd.exited = true));
  child.on("error", (e) => {
    lighttpd.exited = true;
    stderrTail += `\nspawn error: ${e.message}`;
  });
  const deadline = Date.now() + 10_000;
  while (!lighttpd.exited && Date.now() < deadline) {
    const r = await probe(port);
    if (r && r.status === 401 && r.wwwAuthenticate.includes(realm)) return { lighttpd, ready: !lighttpd.exited, stderrTail };
    await sleep(25);
  }
  return { lighttpd, ready: false, stderrTail };
}
