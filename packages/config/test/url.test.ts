import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import fc from "fast-check";
import { REMOTE_TRANSPORTS, remoteUrlProblem } from "../src";
import { gitOutsideRepository, propertyRuns } from "./git";

/**
 * The transport git itself picks for a remote URL, as the worker's fetch of
 * `origin` would: with every transport refused, git names the one it would
 * use and stops before it connects anywhere. Undefined when git refuses the
 * URL before it picks one.
 */
function transportOracle(t: TestContext): (url: string) => string | undefined {
  const git = gitOutsideRepository(t);
  return (url) => {
    const result = git("-c", "protocol.allow=never", "-c", `remote.origin.url=${url}`, "ls-remote", "origin");
    assert.notEqual(result.status, 0, `git reached ${JSON.stringify(url)} with every transport refused`);
    return /transport '([^']*)' not allowed/.exec(result.stderr)?.[1];
  };
}

const FORGE_URLS = [
  "https://github.com/home/homeassistant.git",
  "http://git.home.example:3000/home/config.git",
  "ssh://git@code.example.com:2222/home/homeassistant.git",
  "ssh://[::1]/srv/repo.git",
  "git://127.0.0.1:9418/config.git",
  "git@github.com:home/homeassistant.git",
  "gitea.internal:home/config",
  "deploy@[2001:db8::1]:/srv/git/config.git",
];

const REFUSED: Array<[string, RegExp]> = [
  ["/var/lib/git-csi/repos/0123456789abcdef.git", /local path or file:\/\//],
  ["./repo.git", /local path/],
  ["../other", /local path/],
  ["~/repo.git", /local path/],
  ["file:///var/lib/git-csi/repos/x.git", /file:\/\//],
  ["FILE:///etc", /file:\/\//],
  ["ext::sh -c touch% /tmp/pwned", /ext:: is a helper transport/],
  ["fd::7", /fd:: is a helper transport/],
  ["git-remote-x::anything", /helper transport/],
  ["--upload-pack=touch /tmp/pwned", /would read as an option/],
  ["-oProxyCommand=sh:x", /would read as an option/],
  ["ssh://-oProxyCommand=sh/x", /must be a remote git URL/],
  ["ftp://host/repo.git", /must be a remote git URL/],
  ["https://host", /must be a remote git URL/],
  ["https://host/a b", /must be a remote git URL/],
  ["https://host/a\nb", /must be a remote git URL/],
  ["https://host/a\0b", /must be a remote git URL/],
  ["repo.git", /must be a remote git URL/],
  [`https://host/${"a".repeat(2048)}`, /at most 2048 characters/],
];

test("the URLs forges hand out are accepted, and git reaches each over one of the remote transports", (t) => {
  const gitTransport = transportOracle(t);
  for (const url of FORGE_URLS) {
    assert.equal(remoteUrlProblem(url), undefined, url);
    assert.ok((REMOTE_TRANSPORTS as readonly string[]).includes(gitTransport(url) ?? ""), url);
  }
});

test("local paths, file://, helper transports and option-shaped URLs are refused with the rule and why", () => {
  for (const [url, why] of REFUSED) {
    const problem = remoteUrlProblem(url);
    assert.ok(problem?.startsWith("must be a remote git URL"), `${JSON.stringify(url)}: ${problem}`);
    assert.match(problem ?? "", why, JSON.stringify(url));
  }
});

// Pieces of URLs, good and bad, so that generated ones hit every form git knows.
const SCHEME = fc.constantFrom("", "ssh", "git", "http", "https", "file", "ext", "fd", "ftp", "git+ssh", "HTTPS", "x-y");
const SEPARATOR = fc.constantFrom("://", "::", ":", "", "/");
const USER = fc.constantFrom("", "git@", "a.b@", "-o@", "@");
const HOST = fc.constantFrom("host", "a.example", "[::1]", "127.0.0.1", "-oProxyCommand=x", "", ".", "..", "~");
const PORT = fc.constantFrom("", ":22", ":x", ":");
const PATH = fc.constantFrom("/repo.git", "repo", "", "/", "//x", ":x", "/a b", "/a\tb", "%", "/~u/r", "/x@[::1]/y", "-x");
const GENERATED_URL = fc.oneof(
  { weight: 4, arbitrary: fc.tuple(SCHEME, SEPARATOR, USER, HOST, PORT, PATH).map((parts) => parts.join("")) },
  { weight: 1, arbitrary: fc.string({ maxLength: 20 }).filter((s) => !s.includes("\0")) },
);

test("whatever URL the rule accepts, git reaches over ssh, git, http or https and never the node's files or a program", (t) => {
  const gitTransport = transportOracle(t);
  const runs = propertyRuns(t, 800);
  const seen = { accepted: 0, refusedLocal: 0 };
  fc.assert(
    fc.property(GENERATED_URL, (url) => {
      const transport = gitTransport(url);
      const remote = transport !== undefined && (REMOTE_TRANSPORTS as readonly string[]).includes(transport);
      const accepted = remoteUrlProblem(url) === undefined;
      if (accepted) seen.accepted++;
      if (!accepted && !remote && transport !== undefined) seen.refusedLocal++;
      assert.ok(!accepted || remote, `${JSON.stringify(url)} is accepted, but git reaches it by transport ${transport}`);
    }),
    runs,
  );
  t.diagnostic(`accepted ${seen.accepted}, refused ${seen.refusedLocal} that git would reach by another transport`);
  assert.ok(seen.accepted > runs.numRuns / 20 && seen.refusedLocal > runs.numRuns / 20, JSON.stringify(seen));
});
