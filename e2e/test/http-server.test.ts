import { after, before, test } from "node:test";
import * as assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, readlinkSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import * as http from "node:http";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";

import { gitEnv, runGit, runGitRaw } from "../src/git-server";
import { startHttpGitServer, type HttpGitServer } from "../src/http-server";
import { listeningAddrs } from "../src/proc";

let srv: HttpGitServer;
let work: string;

before(async () => {
  srv = await startHttpGitServer();
  work = await mkdtemp(path.join(os.tmpdir(), "git-csi-httpd-test-"));
});

after(async () => {
  await srv?.stop();
  if (work) await rm(work, { recursive: true, force: true });
});

/** `git -c http.extraHeader=<Authorization: Basic ...> ...args` */
const withAuth = (header: string, ...args: string[]) => ["-c", `http.extraHeader=${header}`, ...args];

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString("base64")}`;

/** Raw HTTP request; resolves to the status code and WWW-Authenticate header. */
function request(method: string, urlPath: string, authorization?: string, body?: string): Promise<{ status: number; wwwAuthenticate: string | undefined }> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { connection: "close" };
    if (authorization) headers.authorization = authorization;
    if (body !== undefined) headers["content-type"] = "application/x-git-receive-pack-request";
    const req = http.request({ host: "127.0.0.1", port: srv.port, method, path: urlPath, headers, agent: false }, (res) => {
      res.resume();
      res.on("end", () => resolve({ status: res.statusCode ?? 0, wwwAuthenticate: res.headers["www-authenticate"] as string | undefined }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

const openFiles = (pid: number) =>
  readdirSync(`/proc/${pid}/fd`).map((fd) => {
    try {
      return readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      return "";
    }
  });

test("lighttpd listens only on 127.0.0.1:<port> and keeps its files in the temp dir", () => {
  assert.deepEqual(listeningAddrs(srv.pid), [`0100007F:${srv.port.toString(16).toUpperCase().padStart(4, "0")}`]);
  const tmpRoot = path.dirname(srv.baseDir);
  const files = openFiles(srv.pid).filter((f) => f.startsWith("/"));
  for (const f of files) {
    assert.ok(f.startsWith(`${tmpRoot}/`) || f.startsWith("/dev/"), `lighttpd has ${f} open`);
  }
  assert.ok(files.includes(path.join(tmpRoot, "error.log")), `error log not open: ${files.join(", ")}`);
  assert.match(srv.token, /^[A-Za-z0-9_-]{32}$/);
  assert.equal(srv.username, "git");
});

test("clone and push over smart HTTP with the token", async () => {
  const initial = await srv.createRepo("demo.git", { files: { "hello.txt": "hello\n" } });
  assert.equal(srv.url("demo.git"), `http://127.0.0.1:${srv.port}/git/demo.git`);
  const auth = srv.authHeader();
  assert.equal(auth, `Authorization: ${basic("git", srv.token)}`);

  const clone = path.join(work, "clone");
  await runGit(withAuth(auth, "clone", "--quiet", srv.url("demo.git"), clone));
  assert.equal(await readFile(path.join(clone, "hello.txt"), "utf8"), "hello\n");
  assert.equal(await runGit(["rev-parse", "HEAD"], { cwd: clone }), initial);
  // no credentials were stored anywhere in the clone
  assert.equal(await runGit(["remote", "get-url", "origin"], { cwd: clone }), srv.url("demo.git"));

  await writeFile(path.join(clone, "hello.txt"), "hello over http\n");
  await runGit(["commit", "--quiet", "-am", "over http"], { cwd: clone });
  const local = await runGit(["rev-parse", "HEAD"], { cwd: clone });
  await runGit(withAuth(auth, "push", "--quiet", "origin", "HEAD:refs/heads/main"), { cwd: clone });
  assert.equal(await srv.git("demo.git", "rev-parse", "refs/heads/main"), local);
  assert.equal(await srv.git("demo.git", "show", "main:hello.txt"), "hello over http");

  const upstream = await srv.commitFiles("demo.git", { "up.txt": "up\n" });
  await runGit(withAuth(auth, "pull", "--quiet", "--ff-only", "origin", "main"), { cwd: clone });
  assert.equal(await runGit(["rev-parse", "HEAD"], { cwd: clone }), upstream);
});

test("a push over http.postBuffer (1 MiB), which git sends chunked, is taken", async () => {
  await srv.createRepo("large.git");
  const clone = path.join(work, "large");
  await runGit(withAuth(srv.authHeader(), "clone", "--quiet", srv.url("large.git"), clone));
  await writeFile(path.join(clone, "large.bin"), randomBytes(2 * 1024 * 1024));
  await runGit(["add", "large.bin"], { cwd: clone });
  await runGit(["commit", "--quiet", "-m", "large"], { cwd: clone });
  const local = await runGit(["rev-parse", "HEAD"], { cwd: clone });
  const push = await runGitRaw(withAuth(srv.authHeader(), "push", "origin", "HEAD:refs/heads/main"), {
    cwd: clone,
    env: gitEnv({ GIT_TRACE_CURL: "1", GIT_TRACE_CURL_NO_DATA: "1" }),
  });
  assert.match(push.stderr, /=> Send header: Transfer-Encoding: chunked/, "git sent the pack chunked");
  assert.equal(
    push.code,
    0,
    push.stderr
      .split("\n")
      .filter((l) => /HTTP\/1\.1 \d|error|fatal/.test(l))
      .join("\n"),
  );
  assert.equal(await srv.git("large.git", "rev-parse", "refs/heads/main"), local);
});

test("fetch and push need the token: missing or wrong credentials get 401", async () => {
  await srv.createRepo("locked.git");
  const base = "/git/locked.git";
  const good = basic("git", srv.token);
  const wrong = basic("git", "not-the-token");

  for (const service of ["git-upload-pack", "git-receive-pack"]) {
    const refs = `${base}/info/refs?service=${service}`;
    const anon = await request("GET", refs);
    assert.equal(anon.status, 401, `${service} anonymous`);
    assert.match(anon.wwwAuthenticate ?? "", /^Basic realm="git-csi-e2e-[0-9a-f]+"/);
    assert.equal((await request("GET", refs, wrong)).status, 401, `${service} wrong token`);
    assert.equal((await request("GET", refs, basic("root", srv.token))).status, 401, `${service} wrong user`);
    assert.equal((await request("GET", refs, good)).status, 200, `${service} token`);
    assert.equal((await request("POST", `${base}/${service}`, wrong, "0000")).status, 401, `${service} POST`);
  }

  const badHeader = `Authorization: ${wrong}`;
  const ls = await runGitRaw(withAuth(badHeader, "ls-remote", srv.url("locked.git")));
  assert.notEqual(ls.code, 0);
  assert.match(ls.stderr, /Authentication failed|could not read Username|401/);

  const clone = path.join(work, "locked");
  await runGit(withAuth(srv.authHeader(), "clone", "--quiet", srv.url("locked.git"), clone));
  await runGit(["commit", "--quiet", "--allow-empty", "-m", "rejected"], { cwd: clone });
  const before = await srv.git("locked.git", "rev-parse", "refs/heads/main");
  const push = await runGitRaw(withAuth(badHeader, "push", "origin", "HEAD:refs/heads/main"), { cwd: clone });
  assert.notEqual(push.code, 0);
  assert.equal(await srv.git("locked.git", "rev-parse", "refs/heads/main"), before);
});

test("rotateToken() invalidates the old token", async () => {
  await srv.createRepo("rotate.git");
  const oldToken = srv.token;
  const oldHeader = srv.authHeader();
  const clone = path.join(work, "rotate");
  await runGit(withAuth(oldHeader, "clone", "--quiet", srv.url("rotate.git"), clone));

  const fresh = srv.rotateToken();
  assert.notEqual(fresh, oldToken);
  assert.equal(srv.token, fresh);
  assert.equal(srv.authHeader(oldToken), oldHeader);

  assert.equal((await request("GET", "/git/rotate.git/info/refs?service=git-upload-pack", basic("git", oldToken))).status, 401);
  assert.notEqual((await runGitRaw(withAuth(oldHeader, "fetch", "origin"), { cwd: clone })).code, 0);

  await runGit(["commit", "--quiet", "--allow-empty", "-m", "after rotation"], { cwd: clone });
  const local = await runGit(["rev-parse", "HEAD"], { cwd: clone });
  assert.notEqual((await runGitRaw(withAuth(oldHeader, "push", "origin", "HEAD:refs/heads/main"), { cwd: clone })).code, 0);
  await runGit(withAuth(srv.authHeader(), "push", "--quiet", "origin", "HEAD:refs/heads/main"), { cwd: clone });
  assert.equal(await srv.git("rotate.git", "rev-parse", "refs/heads/main"), local);
});

test("stop() kills lighttpd and removes the temp dir", async () => {
  const tmpRoot = path.dirname(srv.baseDir);
  const { pid, port } = srv;
  await srv.stop();
  await srv.stop(); // idempotent
  assert.equal(existsSync(`/proc/${pid}`), false);
  assert.equal(existsSync(tmpRoot), false);
  const refused = await new Promise<boolean>((r) => {
    const s = net.connect(port, "127.0.0.1");
    s.on("connect", () => (s.destroy(), r(false)));
    s.on("error", () => r(true));
  });
  assert.equal(refused, true);
});
