import assert from "node:assert/strict";
import { test } from "node:test";
import { ClassParameterError, defaultPolicy, parseClassParameters, parseDuration, parseQuantity } from "../src";

test("the spec 004 example class parses to its policy", () => {
  const policy = parseClassParameters({
    "push.quiesce": "30s",
    "push.maxLatency": "5m",
    "commit.maxFileSize": "1Mi",
    "commit.author": "Home Assistant <homeassistant@home.example>",
    ignore: ".storage/,*.db*,*.log",
  });
  assert.deepEqual(policy, {
    quiesceMs: 30_000,
    maxLatencyMs: 300_000,
    maxFileSizeBytes: 1024 * 1024,
    author: { name: "Home Assistant", email: "homeassistant@home.example" },
    ignore: [".storage/", "*.db*", "*.log"],
  });
});

test("an empty class is the defaults", () => {
  assert.deepEqual(parseClassParameters({}), defaultPolicy());
});

function refused(parameters: Record<string, string>, parameter: string, ruleFragment: RegExp) {
  assert.throws(
    () => parseClassParameters(parameters),
    (err: unknown) => err instanceof ClassParameterError && err.parameter === parameter && ruleFragment.test(err.message),
  );
}

test("a bad value names the parameter and its rule", () => {
  refused({ "push.quiesce": "soon" }, "push.quiesce", /"soon" is not a duration .* from 1s to 1h/);
  refused({ "push.quiesce": "0s" }, "push.quiesce", /from 1s/);
  refused({ "push.maxLatency": "48h" }, "push.maxLatency", /to 24h/);
  refused({ "commit.maxFileSize": "1Ti" }, "commit.maxFileSize", /size in bytes/);
  refused({ "commit.author": "nobody" }, "commit.author", /Name <email>/);
  refused({ ignore: "a\nb" }, "ignore", /line breaks/);
  refused({ ignore: "*.log,\r" }, "ignore", /line breaks/);
  refused({ "push.quiesce": "10m", "push.maxLatency": "1m" }, "push.maxLatency", /shorter than push.quiesce 10m/);
  refused({ "follow.interval": "often" }, "follow.interval", /"often" is not a duration .* from 1s to 24h/);
  refused({ "follow.interval": "500ms" }, "follow.interval", /from 1s/);
});

test("follow.interval is unset unless the class names it", () => {
  assert.equal(defaultPolicy().followMs, undefined);
  assert.equal(parseClassParameters({ "follow.interval": "10s" }).followMs, 10_000);
});

test("an unknown parameter lists the known ones", () => {
  refused({ "push.quiet": "30s" }, "push.quiet", /unknown parameter; the class takes push.quiesce, push.maxLatency, commit.maxFileSize, commit.author, ignore/);
});

test("durations and quantities read as Kubernetes writes them", () => {
  assert.equal(parseDuration("1h30m"), 5_400_000);
  assert.equal(parseDuration("250ms"), 250);
  assert.equal(parseDuration("1.5s"), 1500);
  assert.equal(parseDuration("5"), undefined);
  assert.equal(parseDuration("-5s"), undefined);
  assert.equal(parseQuantity("500k"), 500_000);
  assert.equal(parseQuantity("2Gi"), 2 * 1024 ** 3);
  assert.equal(parseQuantity("1.5Mi"), undefined);
});
