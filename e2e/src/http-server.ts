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
// dir in the temp dir); no system service is involved. Linux only. It buffers
// request bodies, so a chunked push (a pack over git's http.postBuffer) works.

import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { renameSync, writeFileSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import * as http from "node:http";
import * as path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { bareRepoOps, gitEnv, type BareRepoOps } from "./git-server";
import { type Launch, type ServedProcess, ServerRoot } from "./server-process";

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
  // the path ends up inside double-quoted lighttpd config strings
  const root = await ServerRoot.create("git-csi-httpd-", "lighttpd.conf");
  const at = pathsUnder(root.dir);
  const { baseDir, workDir, userFile, configFile } = at;
  const realm = `git-csi-e2e-${randomBytes(6).toString("hex")}`; // unique: the readiness probe knows it hit *this* lighttpd

  let users: UserFile;
  let launched: { port: number; pid: number };
  try {
    await mkdir(baseDir);
    await mkdir(workDir);
    await mkdir(at.docRoot);
    await mkdir(at.uploadDir, { mode: 0o700 });
    users = new UserFile(userFile);
    launched = await root.launch("lighttpd", "127.0.0.1", async (port) => {
      await writeFile(configFile, lighttpdConfig({ ...at, port, realm }));
      return launchLighttpd(at, port, realm);
    });
  } catch (e) {
    await root.stop();
    throw e;
  }

  const ops = bareRepoOps(baseDir, workDir);
  const { port, pid } = launched;
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
    stop: () => root.stop(),
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

/** The private lighttpd's configuration: git http-backend under /git/, basic auth from the users file. */
function lighttpdConfig(at: { port: number; docRoot: string; errorLog: string; pidFile: string; uploadDir: string; userFile: string; realm: string; baseDir: string }): string {
  const q = (s: string) => JSON.stringify(s); // safe: ServerRoot checks the paths
  return [
    "# git-csi e2e: private lighttpd, see e2e/src/http-server.ts",
    `server.modules = ( "mod_access", "mod_alias", "mod_auth", "mod_authn_file", "mod_setenv", "mod_cgi" )`,
    `server.bind = "127.0.0.1"`,
    `server.port = ${at.port}`,
    `server.document-root = ${q(at.docRoot)}`,
    `server.errorlog = ${q(at.errorLog)}`,
    `server.pid-file = ${q(at.pidFile)}`,
    `server.upload-dirs = ( ${q(at.uploadDir)} )`,
    // A CGI needs CONTENT_LENGTH, and git sends a push pack over http.postBuffer (1 MiB) chunked: streamed (1 or 2), lighttpd answers
    // such a body 411 Length Required; buffered (0), it takes the whole body into upload-dirs first and gives git-http-backend its length.
    `server.stream-request-body = 0`,
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
async function launchLighttpd(at: { configFile: string; errorLog: string }, port: number, realm: string): Promise<Launch> {
  const child = spawn(LIGHTTPD, ["-D", "-f", at.configFile], { env: gitEnv(), stdio: ["ignore", "pipe", "pipe"] });
  const lighttpd: ServedProcess = { child, exited: false };
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
    if (r && r.status === 401 && r.wwwAuthenticate.includes(realm)) return { process: lighttpd, ready: !lighttpd.exited, why: "" };
    await sleep(25);
  }
  // lighttpd says why it could not bind in its error log
  const log = await readFile(at.errorLog, "utf8").catch(() => "");
  return { process: lighttpd, ready: false, why: `${stderrTail.trim()}\n${log.trim()}`.trim() };
}
