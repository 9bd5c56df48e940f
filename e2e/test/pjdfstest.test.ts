import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { createVolume, type Driver, stageAndPublish, startDriver, unpublishAndUnstage } from "../src/driver";
import { type GitServer, startGitDaemon } from "../src/git-server";

// pjdfstest, the POSIX conformance suite FUSE file systems are held to, at the
// root of a staged volume's real mount, as root. Built from the tarball in
// ../shared/tools/pjdfstest into .cache/pjdfstest (idempotent). Any failed
// subtest outside e2e/pjdfstest-expected-failures.json fails the test.

const run = promisify(execFile);
const REPO_ROOT = path.resolve(__dirname, "../../..");
const SUITE = path.join(REPO_ROOT, ".cache/pjdfstest");
const BUILD = path.resolve(REPO_ROOT, "../shared/tools/pjdfstest/build.sh");
const EXPECTED = path.join(REPO_ROOT, "e2e/pjdfstest-expected-failures.json");
const SUITE_TIMEOUT_MS = 20 * 60_000;

interface Expected {
  subtests: number[];
  reason: string;
}

/** "1, 3-5" → [1, 3, 4, 5] */
function expand(list: string): number[] {
  return list.split(",").flatMap((part) => {
    const [from, to] = part.trim().split("-").map(Number);
    return Array.from({ length: (to ?? from!) - from! + 1 }, (_, i) => from! + i);
  });
}

/** Failed subtests per test file ("chmod/00.t"), from prove's Test Summary Report. */
function failures(report: string): Map<string, number[]> {
  const failed = new Map<string, number[]>();
  let file: string | undefined;
  let list: string | undefined;
  const flush = () => {
    if (file && list !== undefined) failed.set(file, [...(failed.get(file) ?? []), ...expand(list)]);
    list = undefined;
  };
  for (const line of report.split("\n")) {
    const header = /^\S*\/tests\/(\S+\.t)\s+\(Wstat: (\d+)/.exec(line);
    const listed = /^\s+Failed tests?:\s+(.*)$/.exec(line);
    if (header) {
      flush();
      file = header[1];
      // A file that died without listing subtests is a failure of its own: subtest 0.
      if (header[2] !== "0") failed.set(file!, [...(failed.get(file!) ?? []), 0]);
    } else if (listed) {
      flush();
      list = listed[1]!;
    } else if (list !== undefined && /^\s+[\d, -]+$/.test(line)) {
      list += `, ${line.trim()}`;
    } else flush();
  }
  flush();
  return failed;
}

describe("pjdfstest at the root of a staged volume's mount", () => {
  let server: GitServer;
  let driver: Driver;

  before(async () => {
    await run("bash", [BUILD, SUITE], { maxBuffer: 1 << 24 });
    server = await startGitDaemon();
    driver = await startDriver();
  });

  after(async () => {
    await driver?.stop();
    await server?.stop();
  });

  test("fails no subtest outside the expected-failures list", { timeout: SUITE_TIMEOUT_MS }, async () => {
    // The suite's names stay out of the volume's commits; the volume stays unarmed anyway.
    await server.createRepo("posix.git", { files: { ".gitignore": "pjdfstest_*\n" } });
    const volume = await stageAndPublish(driver, await createVolume(driver, "posix", server.url("posix.git")));
    const expected = JSON.parse(await fs.readFile(EXPECTED, "utf8")) as Record<string, Expected>;
    for (const [file, entry] of Object.entries(expected)) assert.ok(entry.reason.trim() !== "" && entry.subtests.length > 0, `${file}: an entry needs subtests and a reason`);

    const started = Date.now();
    const { stdout } = await run("prove", ["-r", path.join(SUITE, "tests")], { cwd: volume.stagingPath, maxBuffer: 1 << 26, timeout: SUITE_TIMEOUT_MS }).catch((err: { stdout?: string }) => ({
      stdout: err.stdout ?? "",
    }));
    const summary = stdout.slice(stdout.indexOf("\nTest Summary Report") + 1 || stdout.lastIndexOf("\nFiles=") + 1);
    const failed = failures(summary);
    const total = [...failed.values()].reduce((n, s) => n + s.length, 0);
    console.log(`pjdfstest (${Math.round((Date.now() - started) / 1000)} s): ${total} failed subtests in ${failed.size} files\n${summary}`);
    console.log(
      `expected failures (${EXPECTED}):\n${
        Object.entries(expected)
          .map(([file, e]) => `  ${file} ${e.subtests.join(",")}: ${e.reason}`)
          .join("\n") || "  none"
      }`,
    );
    assert.match(stdout, /^Files=\d+, Tests=\d+/m, "prove ran to its summary");

    const unexpected = [...failed].flatMap(([file, subtests]) => subtests.filter((n) => !expected[file]?.subtests.includes(n)).map((n) => `${file} ${n}`));
    assert.deepEqual(unexpected, [], "subtests failed that the expected-failures list does not name");
    await unpublishAndUnstage(driver, volume);
  });
});
