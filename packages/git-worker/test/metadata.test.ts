import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import * as fs from "node:fs/promises";
import * as os from "node:os";
import * as path from "node:path";
import { after, test } from "node:test";
import { simpleGit, type SimpleGit } from "simple-git";
import { branchTreeName, formatListing, listingKey, listingPath, type MetadataEntry, parseListing } from "../src/metadata/format";
import { ListingCache } from "../src/metadata/plumbing";
import { recordMetadata } from "../src/metadata/record";
import { replayMetadata } from "../src/metadata/replay";

const author = { name: "git-csi", email: "git-csi@localhost" };
const temps: string[] = [];
after(async () => {
  for (const t of temps) await fs.rm(t, { recursive: true, force: true });
});

interface Fixture {
  dir: string;
  bare: string;
  repo: SimpleGit;
  tree: string;
  index: string;
  cache: ListingCache;
  git: (args: string[], env?: Record<string, string>, input?: string) => string;
}

async function fixture(): Promise<Fixture> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "metadata-test-"));
  temps.push(dir);
  const bare = path.join(dir, "repo.git");
  const git = (args: string[], env: Record<string, string> = {}, input?: string) =>
    execFileSync("git", args, { cwd: dir, env: { PATH: process.env.PATH, HOME: dir, GIT_DIR: bare, ...env }, input, encoding: "utf8", maxBuffer: 1 << 28, stdio: ["pipe", "pipe", "pipe"] });
  git(["init", "--bare", "--quiet", bare]);
  const repo = simpleGit({ baseDir: dir, trimmed: false }).env({ PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: dir, GIT_DIR: bare });
  const tree = path.join(dir, "tree");
  await fs.mkdir(tree);
  return { dir, bare, repo, tree, index: path.join(dir, "sync", "metadata.index"), cache: new ListingCache(), git };
}

async function file(p: string, mode: number, content = "x\n"): Promise<void> {
  await fs.mkdir(path.dirname(p), { recursive: true });
  await fs.writeFile(p, content);
  await fs.chmod(p, mode);
}

async function dir(p: string, mode: number): Promise<void> {
  await fs.mkdir(p, { recursive: true });
  await fs.chmod(p, mode);
}

function entry(name: string, type: MetadataEntry["type"], mode: number, uid = 0, gid = 0): MetadataEntry {
  return { name, type, mode, uid, gid };
}

/** A listing as the metadata commit holds it, or undefined when it has none. */
function listing(f: Fixture, commit: string, branch: string, d: string): { dir?: string; entries: MetadataEntry[] } | undefined {
  let text: string;
  try {
    text = f.git(["cat-file", "blob", `${commit}:${listingPath(branch, d)}`], {}, undefined);
  } catch {
    return undefined;
  }
  const parsed = parseListing(text);
  assert.equal(parsed.problem, undefined);
  assert.deepEqual(parsed.refused, []);
  return { dir: parsed.dir, entries: parsed.entries };
}

/** path → blob oid of every blob in a metadata commit. */
function blobsOf(f: Fixture, commit: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of f.git(["ls-tree", "-r", commit]).split("\n")) {
    const m = /^\d+ blob ([0-9a-f]+)\t(.*)$/.exec(line);
    if (m) out.set(m[2]!, m[1]!);
  }
  return out;
}

function changedBlobs(f: Fixture, from: string, to: string): string[] {
  const a = blobsOf(f, from);
  const b = blobsOf(f, to);
  return [...new Set([...a.keys(), ...b.keys()])].filter((p) => a.get(p) !== b.get(p)).sort();
}

function blobCount(f: Fixture): number {
  return f
    .git(["cat-file", "--batch-all-objects", "--batch-check"])
    .split("\n")
    .filter((l) => / blob /.test(l)).length;
}

/** The sample tree: odd modes, owners, empty directories, a symlink, and a .git file that is never recorded. */
async function sampleTree(tree: string): Promise<void> {
  await file(path.join(tree, "README"), 0o644);
  await file(path.join(tree, "secret"), 0o600);
  await file(path.join(tree, "bin/run"), 0o755);
  await file(path.join(tree, "bin/suid"), 0o4755);
  await dir(path.join(tree, "bin"), 0o755);
  await file(path.join(tree, "shared/owned"), 0o640);
  await dir(path.join(tree, "shared"), 0o1777);
  await fs.chown(path.join(tree, "shared"), 1234, 5678);
  await fs.chown(path.join(tree, "shared/owned"), 1234, 5678);
  await dir(path.join(tree, "empty"), 0o750);
  await dir(path.join(tree, "deep/er/est"), 0o700);
  await fs.chmod(path.join(tree, "deep/er"), 0o755);
  await fs.chmod(path.join(tree, "deep"), 0o755);
  await fs.symlink("README", path.join(tree, "link"));
  await fs.lchown(path.join(tree, "link"), 1234, 5678);
  await file(path.join(tree, ".git"), 0o644, "gitdir: /nowhere\n");
}

const sampleFiles = ["README", "secret", "bin/run", "bin/suid", "shared/owned", "link", "empty", "deep/er/est"];

async function record(f: Fixture, base: string, changedPaths: string[], branch = "main", tree?: SimpleGit): Promise<string> {
  return recordMetadata({ gitDir: f.bare, cache: f.cache, treeDir: f.tree, branch, base, changedPaths, indexFile: f.index, author, ...(tree ? { tree } : {}) });
}

test("branch names and keys", () => {
  assert.equal(branchTreeName("main"), "main");
  assert.equal(branchTreeName("feature/x"), "feature%2Fx");
  assert.equal(branchTreeName("a%2Fb"), "a%252Fb");
  const root = createHash("sha1").update("").digest("hex");
  assert.equal(listingKey(""), `${root.slice(0, 2)}/${root}`);
  assert.equal(listingPath("feature/x", "a/b"), `feature%2Fx/${listingKey("a/b")}`);
  assert.equal(
    formatListing("a", [entry("z", "file", 0o644), entry("B", "dir", 0o755, 1, 2)]),
    '{"dir":"a"}\n{"name":"B","type":"dir","mode":493,"uid":1,"gid":2}\n{"name":"z","type":"file","mode":420,"uid":0,"gid":0}\n',
  );
});

test("a record lists modes, owners, empty directories and symlinks, one blob per directory", async () => {
  const f = await fixture();
  await sampleTree(f.tree);
  const commit = await record(f, "", sampleFiles);
  assert.match(commit, /^[0-9a-f]{40}$/);

  assert.deepEqual(listing(f, commit, "main", ""), {
    dir: "",
    entries: [
      entry("README", "file", 0o644),
      entry("bin", "dir", 0o755),
      entry("deep", "dir", 0o755),
      entry("empty", "dir", 0o750),
      entry("link", "symlink", 0o777, 1234, 5678),
      entry("secret", "file", 0o600),
      entry("shared", "dir", 0o1777, 1234, 5678),
    ],
  });
  assert.deepEqual(listing(f, commit, "main", "bin")?.entries, [entry("run", "file", 0o755), entry("suid", "file", 0o4755)]);
  assert.deepEqual(listing(f, commit, "main", "shared")?.entries, [entry("owned", "file", 0o640, 1234, 5678)]);
  assert.deepEqual(listing(f, commit, "main", "deep")?.entries, [entry("er", "dir", 0o755)]);
  assert.deepEqual(listing(f, commit, "main", "deep/er")?.entries, [entry("est", "dir", 0o700)]);
  // An empty directory is a dir entry with no listing of its own.
  assert.equal(listing(f, commit, "main", "empty"), undefined);
  assert.equal(listing(f, commit, "main", "deep/er/est"), undefined);
  // Only the branch's tree at the top, only hashed names below it.
  assert.equal(f.git(["ls-tree", "--name-only", commit]).trim(), "main");
  assert.deepEqual([...blobsOf(f, commit).keys()].sort(), ["", "bin", "deep", "deep/er", "shared"].map((d) => listingPath("main", d)).sort());
  const raw = f.git(["cat-file", "blob", `${commit}:${listingPath("main", "bin")}`]);
  assert.equal(raw, '{"dir":"bin"}\n{"name":"run","type":"file","mode":493,"uid":0,"gid":0}\n{"name":"suid","type":"file","mode":2541,"uid":0,"gid":0}\n');
  assert.match(f.git(["cat-file", "-p", commit]), /^author git-csi <git-csi@localhost> /m);

  // Deterministic: the same tree and base give the same tree; nothing new on top of itself.
  const again = await record(f, "", [...sampleFiles].reverse());
  assert.equal(f.git(["rev-parse", `${again}^{tree}`]), f.git(["rev-parse", `${commit}^{tree}`]));
  assert.equal(await record(f, commit, sampleFiles), commit);
  assert.equal(await record(f, commit, []), commit);
});

test("a change rewrites only the listing of its directory", async () => {
  const f = await fixture();
  await sampleTree(f.tree);
  const first = await record(f, "", sampleFiles);

  await fs.chmod(path.join(f.tree, "bin/run"), 0o700);
  const second = await record(f, first, ["bin/run"]);
  assert.notEqual(second, first);
  assert.equal(f.git(["rev-parse", `${second}^`]).trim(), first);
  assert.deepEqual(changedBlobs(f, first, second), [listingPath("main", "bin")]);
  assert.deepEqual(listing(f, second, "main", "bin")?.entries, [entry("run", "file", 0o700), entry("suid", "file", 0o4755)]);

  await file(path.join(f.tree, "shared/new"), 0o660);
  const third = await record(f, second, ["shared/new"]);
  assert.deepEqual(changedBlobs(f, second, third), [listingPath("main", "shared")]);

  // A directory's own mode lives in its parent's listing.
  await fs.chmod(path.join(f.tree, "shared"), 0o1770);
  const fourth = await record(f, third, ["shared"]);
  assert.deepEqual(changedBlobs(f, third, fourth), [listingPath("main", "")]);
  assert.deepEqual(
    listing(f, fourth, "main", "")?.entries.find((e) => e.name === "shared"),
    entry("shared", "dir", 0o1770, 1234, 5678),
  );

  // A file's content alone changes no listing: nothing to commit.
  await fs.writeFile(path.join(f.tree, "README"), "new content\n");
  assert.equal(await record(f, fourth, ["README"]), fourth);
});

test("a record on a commit the worker wrote reads its listings from the cache, and a fresh read gives the same commit", async () => {
  const f = await fixture();
  await sampleTree(f.tree);
  const first = await record(f, "", sampleFiles);
  await fs.chmod(path.join(f.tree, "bin/run"), 0o700);
  const second = await record(f, first, ["bin/run"]);
  await fs.writeFile(path.join(f.tree, "bin/run"), "appended\n", { flag: "a" });
  // No repository at all: a record that asked git anything would fail.
  const none = path.join(f.dir, "none.git");
  await fs.mkdir(none);
  const unchanged = await recordMetadata({ gitDir: none, cache: f.cache, treeDir: f.tree, branch: "main", base: second, changedPaths: ["bin/run"], indexFile: f.index, author });
  assert.equal(unchanged, second);

  await fs.chmod(path.join(f.tree, "bin/run"), 0o750);
  const cached = await record(f, second, ["bin/run"]);
  const fresh = await recordMetadata({ gitDir: f.bare, cache: new ListingCache(), treeDir: f.tree, branch: "main", base: second, changedPaths: ["bin/run"], indexFile: f.index, author });
  assert.equal(f.git(["rev-parse", `${cached}^{tree}`]), f.git(["rev-parse", `${fresh}^{tree}`]));
});

test("a deleted directory drops its listing and every listing below it", async () => {
  const f = await fixture();
  await sampleTree(f.tree);
  const first = await record(f, "", sampleFiles);
  await fs.rm(path.join(f.tree, "deep"), { recursive: true });
  const second = await record(f, first, ["deep"]);
  assert.equal(listing(f, second, "main", "deep"), undefined);
  assert.equal(listing(f, second, "main", "deep/er"), undefined);
  assert.deepEqual(changedBlobs(f, first, second), [listingPath("main", ""), listingPath("main", "deep"), listingPath("main", "deep/er")].sort());
  assert.equal(
    listing(f, second, "main", "")?.entries.some((e) => e.name === "deep"),
    false,
  );

  // A rename is a directory that vanished and one that appeared, whichever paths the watcher names.
  await fs.rename(path.join(f.tree, "bin"), path.join(f.tree, "tools"));
  const renamed = await record(f, second, ["bin/run", "bin/suid", "tools/run", "tools/suid"]);
  assert.equal(listing(f, renamed, "main", "bin"), undefined);
  assert.deepEqual(listing(f, renamed, "main", "tools")?.entries, [entry("run", "file", 0o755), entry("suid", "file", 0o4755)]);
  assert.deepEqual(changedBlobs(f, second, renamed), [listingPath("main", ""), listingPath("main", "bin"), listingPath("main", "tools")].sort());

  // A directory swapped for a symlink out of the tree: never followed, its listing dropped.
  const outside = path.join(f.dir, "outside");
  await file(path.join(outside, "do-not-list"), 0o600);
  await fs.rm(path.join(f.tree, "shared"), { recursive: true });
  await fs.symlink(outside, path.join(f.tree, "shared"));
  const third = await record(f, second, ["shared/owned"]);
  assert.equal(listing(f, third, "main", "shared"), undefined);
  assert.deepEqual(listing(f, third, "main", "")?.entries.find((e) => e.name === "shared")?.type, "symlink");
  for (const oid of blobsOf(f, third).values()) assert.doesNotMatch(f.git(["cat-file", "blob", oid]), /do-not-list/);
});

test("a new directory is recorded with its ancestors from one deep path, per branch", async () => {
  const f = await fixture();
  await sampleTree(f.tree);
  const first = await record(f, "", sampleFiles);
  await file(path.join(f.tree, "new/a/b/f"), 0o640);
  const second = await record(f, first, ["new/a/b/f"]);
  assert.deepEqual(changedBlobs(f, first, second), ["", "new", "new/a", "new/a/b"].map((d) => listingPath("main", d)).sort());
  assert.deepEqual(listing(f, second, "main", "new/a/b")?.entries, [entry("f", "file", 0o640)]);

  // Another branch lives beside main in the same commit and leaves main's listings alone.
  const third = await record(f, second, ["README"], "feature/x");
  assert.deepEqual(f.git(["ls-tree", "--name-only", third]).trim().split("\n"), ["feature%2Fx", "main"]);
  assert.deepEqual(
    changedBlobs(f, second, third).filter((p) => p.startsWith("main/")),
    [],
  );
  assert.deepEqual(listing(f, third, "feature/x", "new/a")?.entries, [entry("b", "dir", 0o755 & ~process.umask())]);
});

/** A fixture whose tree has git of its own, as the store's, ignoring .storage/ and *.log. */
async function ignoringFixture(): Promise<{ f: Fixture; wt: string; treeGit: SimpleGit }> {
  const f = await fixture();
  const wt = path.join(f.dir, "wt.git");
  f.git(["init", "--bare", "--quiet", wt]);
  f.git(["config", "core.bare", "false"], { GIT_DIR: wt });
  const excludes = path.join(f.dir, "ignore");
  await fs.writeFile(excludes, ".storage/\n*.log\n!kept.log\n");
  const treeGit = simpleGit({ baseDir: f.dir, trimmed: false, config: [`core.excludesFile=${excludes}`] }).env({
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    HOME: f.dir,
    GIT_DIR: wt,
    GIT_WORK_TREE: f.tree,
    GIT_LITERAL_PATHSPECS: "1",
  });
  return { f, wt, treeGit };
}

test("ignored paths are not recorded when the tree's git is given", async () => {
  const { f, wt, treeGit } = await ignoringFixture();
  await file(path.join(f.tree, "conf.yaml"), 0o600);
  await file(path.join(f.tree, "app.log"), 0o600);
  await file(path.join(f.tree, 'é "q".log'), 0o600);
  await file(path.join(f.tree, "tracked.log"), 0o640);
  await file(path.join(f.tree, "kept.log"), 0o640);
  await file(path.join(f.tree, ":colon.log"), 0o600);
  await file(path.join(f.tree, ":conf"), 0o600);
  await file(path.join(f.tree, ".storage/db"), 0o600);
  await file(path.join(f.tree, "data/.storage/db"), 0o600);
  f.git(["add", "-f", "tracked.log"], { GIT_DIR: wt, GIT_WORK_TREE: f.tree });
  const commit = await record(f, "", ["conf.yaml", "app.log", ".storage/db", "data/.storage/db"], "main", treeGit);
  assert.deepEqual(
    listing(f, commit, "main", "")?.entries.map((e) => e.name),
    [":conf", "conf.yaml", "data", "kept.log", "tracked.log"],
  );
  assert.equal(listing(f, commit, "main", "data"), undefined);
  assert.equal(listing(f, commit, "main", ".storage"), undefined);

  // A change inside an ignored directory records nothing.
  await fs.chmod(path.join(f.tree, ".storage/db"), 0o644);
  assert.equal(await record(f, commit, [".storage/db"], "main", treeGit), commit);
});

test("ignored paths are not recorded either when a first record asks about more paths than one batch", async () => {
  const { f, wt, treeGit } = await ignoringFixture();
  for (let i = 0; i < 600; i++) await file(path.join(f.tree, "bulk", `f${i}.yaml`), 0o640);
  await file(path.join(f.tree, "bulk", "noise.log"), 0o600);
  await file(path.join(f.tree, "tracked.log"), 0o640);
  await file(path.join(f.tree, ".storage/db"), 0o600);
  await file(path.join(f.tree, "bulk/.storage/db"), 0o600);
  f.git(["add", "-f", "tracked.log"], { GIT_DIR: wt, GIT_WORK_TREE: f.tree });
  const commit = await record(f, "", [""], "main", treeGit);
  assert.deepEqual(
    listing(f, commit, "main", "")?.entries.map((e) => e.name),
    ["bulk", "tracked.log"],
  );
  const bulk = listing(f, commit, "main", "bulk")?.entries.map((e) => e.name) ?? [];
  assert.equal(bulk.length, 600);
  assert.ok(!bulk.includes("noise.log") && !bulk.includes(".storage"));
  assert.equal(listing(f, commit, "main", "bulk/.storage"), undefined);
});

test("a path inside a submodule is left out and named, in a batch and in a first record's walk of more paths than one batch", async () => {
  const { f, wt, treeGit } = await ignoringFixture();
  await file(path.join(f.tree, "conf.yaml"), 0o640);
  await file(path.join(f.tree, "vendor/lib/lib.h"), 0o640);
  // A gitlink, as a submodule's entry is in its superproject: check-ignore refuses a path below it.
  f.git(["update-index", "--add", "--cacheinfo", `160000,${"1".repeat(40)},vendor/lib`], { GIT_DIR: wt, GIT_WORK_TREE: f.tree });
  // A record may tell of a path more than once (one wave lists its directory, another patches it): the reporter names it once.
  const told: [string, string][] = [];
  const recordIn = (base: string, changedPaths: string[]) =>
    recordMetadata({ gitDir: f.bare, cache: f.cache, treeDir: f.tree, branch: "main", base, changedPaths, indexFile: f.index, author, tree: treeGit, inSubmodule: (p, s) => told.push([p, s]) });

  const batch = await recordIn("", ["conf.yaml", "vendor/lib/lib.h"]);
  assert.deepEqual([...new Map(told)], [["vendor/lib/lib.h", "vendor/lib"]]);
  assert.deepEqual(
    listing(f, batch, "main", "vendor")?.entries.map((e) => e.name),
    ["lib"],
  );
  assert.equal(listing(f, batch, "main", "vendor/lib"), undefined);

  // The walk lists vendor/bulk and vendor/lib in one wave: more paths than one batch.
  for (let i = 0; i < 600; i++) await file(path.join(f.tree, "vendor/bulk", `f${i}.yaml`), 0o640);
  told.length = 0;
  const walked = await recordIn("", [""]);
  assert.deepEqual([...new Map(told)], [["vendor/lib/lib.h", "vendor/lib"]]);
  assert.equal(listing(f, walked, "main", "vendor/bulk")?.entries.length, 600);
  assert.equal(listing(f, walked, "main", "vendor/lib"), undefined);
});

test("a replay restores modes, owners and empty directories in a fresh checkout", async () => {
  const f = await fixture();
  await sampleTree(f.tree);
  const commit = await record(f, "", sampleFiles);

  // A fresh checkout: the files, default modes and owners, no empty directories.
  const fresh = path.join(f.dir, "fresh");
  for (const p of ["README", "secret", "bin/run", "bin/suid", "shared/owned"]) await file(path.join(fresh, p), 0o644);
  await fs.symlink("README", path.join(fresh, "link"));
  const logs: [string, Record<string, unknown>][] = [];
  const result = await replayMetadata({ repo: f.repo, treeDir: fresh, branch: "main", metadata: commit, log: (m, fields) => logs.push([m, fields]) });
  assert.deepEqual(result.refused, []);
  assert.deepEqual(logs, []);
  assert.equal(result.applied, 7 + 2 + 1 + 1 + 1);

  const mode = async (p: string) => {
    const st = await fs.lstat(path.join(fresh, p));
    return [st.mode & 0o7777, st.uid, st.gid];
  };
  assert.deepEqual(await mode("README"), [0o644, 0, 0]);
  assert.deepEqual(await mode("secret"), [0o600, 0, 0]);
  assert.deepEqual(await mode("bin/run"), [0o755, 0, 0]);
  assert.deepEqual(await mode("bin/suid"), [0o4755, 0, 0]);
  assert.deepEqual(await mode("shared"), [0o1777, 1234, 5678]);
  assert.deepEqual(await mode("shared/owned"), [0o640, 1234, 5678]);
  assert.deepEqual(await mode("empty"), [0o750, 0, 0]);
  assert.deepEqual(await mode("deep/er/est"), [0o700, 0, 0]);
  assert.deepEqual(await mode("deep/er"), [0o755, 0, 0]);
  const link = await fs.lstat(path.join(fresh, "link"));
  assert.ok(link.isSymbolicLink());
  assert.deepEqual([link.uid, link.gid], [1234, 5678]);
  assert.equal(await fs.readlink(path.join(fresh, "link")), "README");
  assert.deepEqual(await fs.readdir(path.join(fresh, "empty")), []);
  assert.equal(await fs.lstat(path.join(fresh, ".git")).catch(() => undefined), undefined);
});

test("hostile listings are refused and logged while the good entries still apply", async () => {
  const f = await fixture();
  const outside = path.join(f.dir, "outside");
  await file(path.join(outside, "sentinel"), 0o600);
  await dir(path.join(outside, "sub"), 0o700);
  await file(path.join(f.tree, "good"), 0o644);
  await fs.symlink(outside, path.join(f.tree, "link"));

  const line = (o: unknown) => JSON.stringify(o);
  const e = (name: unknown, extra: Record<string, unknown> = {}) => line({ name, type: "file", mode: 0o777, uid: 0, gid: 0, ...extra });
  const listings: [string, string][] = [
    [
      listingKey(""),
      [
        line({ dir: "" }),
        e("good", { mode: 0o640, uid: 1234, gid: 5678 }),
        line({ name: "gooddir", type: "dir", mode: 0o701, uid: 1234, gid: 0 }),
        e(".."),
        e("absurd", { mode: 0o177777 }),
        e("negative", { uid: -1 }),
        e("fifo", { type: "fifo" }),
        e("a/b"),
        e(".git", { type: "dir" }),
        "not json",
        line({ name: "link", type: "dir", mode: 0o777, uid: 0, gid: 0 }),
        "",
      ].join("\n"),
    ],
    [listingKey(outside), [line({ dir: outside }), e("sentinel")].join("\n")],
    [listingKey("../outside"), [line({ dir: "../outside" }), e("sentinel")].join("\n")],
    [listingKey("link"), [line({ dir: "link" }), e("sentinel")].join("\n")],
    [listingKey("link/sub"), [line({ dir: "link/sub" }), e("x")].join("\n")],
    [listingKey("elsewhere"), [line({ dir: "gooddir" }), e("misplaced")].join("\n")],
    [listingKey("gooddir"), [line({ dir: "gooddir" }), line({ name: "inner", type: "dir", mode: 0o711, uid: 0, gid: 5678 })].join("\n")],
  ];
  const index = path.join(f.dir, "hostile.index");
  const env = { GIT_INDEX_FILE: index, GIT_AUTHOR_NAME: "x", GIT_AUTHOR_EMAIL: "x@x", GIT_COMMITTER_NAME: "x", GIT_COMMITTER_EMAIL: "x@x" };
  f.git(["read-tree", "--empty"], env);
  for (const [key, text] of listings) {
    const oid = f.git(["hash-object", "-w", "--stdin"], env, `${text}\n`).trim();
    f.git(["update-index", "--add", "--cacheinfo", `100644,${oid},main/${key}`], env);
  }
  const junk = f.git(["hash-object", "-w", "--stdin"], env, "junk\n").trim();
  f.git(["update-index", "--add", "--cacheinfo", `100644,${junk},main/not-a-key`], env);
  const commit = f.git(["commit-tree", f.git(["write-tree"], env).trim(), "-m", "hostile"], env).trim();

  const logs: [string, Record<string, unknown>][] = [];
  const result = await replayMetadata({ repo: f.repo, treeDir: f.tree, branch: "main", metadata: commit, log: (m, fields) => logs.push([m, fields]) });
  assert.deepEqual(
    [...result.refused].sort(),
    ["..", ".:10", ".git", "../outside", "a/b", "absurd", "fifo", "gooddir", "link", "link/sub", "negative", outside, "refs/git-csi/metadata:main/not-a-key"].sort(),
  );
  const refusals = logs.filter(([m]) => m === "refused a metadata entry").map(([, fields]) => fields.path);
  assert.deepEqual([...refusals].sort(), [...result.refused].sort(), "each refusal is logged once");
  for (const [, fields] of logs) assert.equal(typeof fields.path, "string");

  // The good entries apply.
  const good = await fs.lstat(path.join(f.tree, "good"));
  assert.deepEqual([good.mode & 0o7777, good.uid, good.gid], [0o640, 1234, 5678]);
  const gooddir = await fs.lstat(path.join(f.tree, "gooddir"));
  assert.ok(gooddir.isDirectory());
  assert.deepEqual([gooddir.mode & 0o7777, gooddir.uid], [0o701, 1234]);
  const inner = await fs.lstat(path.join(f.tree, "gooddir/inner"));
  assert.deepEqual([inner.mode & 0o7777, inner.gid], [0o711, 5678]);
  assert.equal(await fs.lstat(path.join(f.tree, "gooddir/misplaced")).catch(() => undefined), undefined);
  assert.equal(result.applied, 3);

  // Nothing outside the tree changed, and the symlink is still a symlink.
  const sentinel = await fs.lstat(path.join(outside, "sentinel"));
  assert.deepEqual([sentinel.mode & 0o7777, sentinel.uid, sentinel.gid], [0o600, 0, 0]);
  assert.equal((await fs.lstat(path.join(outside, "sub"))).mode & 0o7777, 0o700);
  assert.deepEqual((await fs.readdir(outside)).sort(), ["sentinel", "sub"]);
  assert.ok((await fs.lstat(path.join(f.tree, "link"))).isSymbolicLink());
  assert.equal(await fs.lstat(path.join(f.tree, ".git")).catch(() => undefined), undefined);
  assert.equal(await fs.lstat(path.join(f.dir, "a")).catch(() => undefined), undefined);
});

test("the cost follows the change: one changed file among 2,000 writes one blob", async () => {
  const f = await fixture();
  const all: string[] = [];
  for (let d = 0; d < 20; d++) {
    const dirName = `d${String(d).padStart(2, "0")}`;
    await fs.mkdir(path.join(f.tree, dirName));
    await Promise.all(
      Array.from({ length: 100 }, (_, i) => {
        const rel = `${dirName}/f${String(i).padStart(3, "0")}`;
        all.push(rel);
        return fs.writeFile(path.join(f.tree, rel), `${i}\n`, { mode: 0o644 });
      }),
    );
  }
  const first = await record(f, "", all);
  assert.equal(blobsOf(f, first).size, 21);
  const before = blobCount(f);

  await fs.chmod(path.join(f.tree, "d07/f042"), 0o600);
  const second = await record(f, first, ["d07/f042"]);
  assert.equal(blobCount(f) - before, 1, "exactly one new blob");
  assert.deepEqual(changedBlobs(f, first, second), [listingPath("main", "d07")]);
  assert.deepEqual(
    listing(f, second, "main", "d07")?.entries.find((e) => e.name === "f042"),
    entry("f042", "file", 0o600),
  );

  // A new file in a known directory: again one blob.
  const before2 = blobCount(f);
  await fs.writeFile(path.join(f.tree, "d13/new"), "n\n", { mode: 0o640 });
  const third = await record(f, second, ["d13/new"]);
  assert.equal(blobCount(f) - before2, 1);
  assert.deepEqual(changedBlobs(f, second, third), [listingPath("main", "d13")]);
});

test("a base listing that breaks the rules is written clean when its directory changes", async () => {
  const f = await fixture();
  await file(path.join(f.tree, "a"), 0o644);
  await file(path.join(f.tree, "b"), 0o600);
  const bad = [
    JSON.stringify({ dir: "" }),
    JSON.stringify(entry("a", "file", 0o644)),
    JSON.stringify({ ...entry("..", "file", 0o777) }),
    JSON.stringify({ ...entry("x", "file", 0o177777) }),
    "junk",
    "",
  ].join("\n");
  const env = { GIT_INDEX_FILE: path.join(f.dir, "bad.index"), GIT_AUTHOR_NAME: "x", GIT_AUTHOR_EMAIL: "x@x", GIT_COMMITTER_NAME: "x", GIT_COMMITTER_EMAIL: "x@x" };
  const oid = f.git(["hash-object", "-w", "--stdin"], env, bad).trim();
  f.git(["read-tree", "--empty"], env);
  f.git(["update-index", "--add", "--cacheinfo", `100644,${oid},${listingPath("main", "")}`], env);
  const base = f.git(["commit-tree", f.git(["write-tree"], env).trim(), "-m", "bad"], env).trim();
  const next = await record(f, base, ["b"]);
  assert.equal(f.git(["cat-file", "blob", `${next}:${listingPath("main", "")}`]), formatListing("", [entry("a", "file", 0o644), entry("b", "file", 0o600)]));
});
