// `git-csi report <volume>`: one volume's report, as the node plugin's git
// worker serves it at /volumes/<volume> on its metrics listener: what the
// volume would commit, what it waits for, why it is abnormal.
import { parseFlags, UsageError } from "@git-csi/config";
import type { gitWorker } from "@git-csi/protos";

/** The chart's node.metricsPort: in a node plugin pod, the git worker listens there. */
const DEFAULT_METRICS_ADDRESS = "127.0.0.1:9860";
const TIMEOUT_MS = 10_000;

/** A failure the operator can act on; the command prints it and exits 1. */
class ReportError extends Error {}

/** Fetches one volume's report; the raw JSON too, for --json. */
async function fetchReport(address: string, volumeId: string): Promise<{ raw: string; report: gitWorker.VolumeReport }> {
  const url = `http://${address}/volumes/${encodeURIComponent(volumeId)}`;
  let response: Response;
  try {
    response = await fetch(url, { signal: AbortSignal.timeout(TIMEOUT_MS) });
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    throw new ReportError(`no answer from the metrics listener at ${address} (${cause?.code ?? cause?.message ?? String(err)}): is the git worker running with --metrics-address ${address}?`);
  }
  const body = await response.text();
  if (response.status === 404) throw new ReportError(`volume ${volumeId} is not staged on the node whose git worker listens at ${address}${body.trim() ? ` (${body.trim()})` : ""}`);
  if (!response.ok) throw new ReportError(`${url} answered ${response.status}: ${body.trim()}`);
  try {
    return { raw: body, report: JSON.parse(body) as gitWorker.VolumeReport };
  } catch {
    throw new ReportError(`${url} answered something that is not a volume report: ${body.slice(0, 200)}`);
  }
}

function ago(ms: number, now: number): string {
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 120) return `${s} s ago`;
  if (s < 7200) return `${Math.round(s / 60)} min ago`;
  if (s < 172_800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86_400)} days ago`;
}

function list(title: string, items: string[], none: string): string[] {
  return items.length === 0 ? [`${title}: ${none}`] : [`${title}:`, ...items.map((i) => `  ${i}`)];
}

/** The report for a person: the answer to "is it all right" first, the detail after. */
function formatReport(r: gitWorker.VolumeReport, now = Date.now()): string {
  const claim = r.claim?.name ? `${r.claim.namespace}/${r.claim.name}` : "none known (no claim reached the node: standalone, or not yet)";
  const head = [`volume ${r.volumeId}`, `claim: ${claim}`, r.abnormal.length === 0 ? "status: normal" : `status: ABNORMAL (${r.abnormal.length})`, ...r.abnormal.map((a) => `  ${a}`)];
  // A read-only volume commits and pushes nothing: what it serves is all there is to say.
  if (r.servedCommit) return `${[...head, `read-only: serves commit ${r.servedCommit} of ${r.followsBranch}`].join("\n")}\n`;
  const lines = [
    ...head,
    r.armed ? `armed by class ${r.className || "(unnamed)"}: commits and pushes` : "unarmed: commits nothing; a VolumeAttributesClass on the claim arms it",
    `pushes to: ${r.sideBranch ? `${r.sideBranch} (side branch, diverged from ${r.pushBranch})` : r.pushBranch || "(not known yet)"}`,
    ...list(`would commit (${r.pendingPaths.length})`, r.pendingPaths, "nothing"),
    ...list("waits for", r.waitingFor, "nothing"),
    `unpushed commits: ${r.unpushedCommits}`,
    `last push: ${r.lastPushUnixMs > 0 ? `${new Date(r.lastPushUnixMs).toISOString()} (${ago(r.lastPushUnixMs, now)})` : "never"}`,
    `push failures: ${r.pushFailures}`,
    ...list(`skipped, over commit.maxFileSize (${r.skippedPaths.length})`, r.skippedPaths, "none"),
    ...list(
      "recent events",
      r.recentEvents.map((e) => `${new Date(e.timeUnixMs).toISOString()}  ${e.type.padEnd(7)}  ${e.reason.padEnd(26)}  ${e.message}`),
      "none",
    ),
  ];
  return `${lines.join("\n")}\n`;
}

const SUMMARY =
  "Prints one volume's report from the git worker's metrics listener: what it would commit, what it waits for, why it is abnormal, its recent events. Exits 1 when the volume is unknown there or the listener does not answer.";

/** `git-csi report <volume> [--metrics-address host:port] [--json]`. */
export async function reportCommand(argv: string[]): Promise<void> {
  // parseFlags takes only --name value; --json alone is a switch, and the volume a positional.
  const positional: string[] = [];
  const flagArgs: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--json") flagArgs.push("--json=true");
    else if (!arg.startsWith("-")) positional.push(arg);
    else {
      flagArgs.push(arg);
      if (!arg.includes("=") && arg !== "--help" && arg !== "-h" && i + 1 < argv.length) flagArgs.push(argv[++i]!);
    }
  }
  const flags = parseFlags(flagArgs, "git-csi report <volume>", SUMMARY, [
    { name: "metrics-address", help: "host:port of the git worker's metrics listener", default: DEFAULT_METRICS_ADDRESS },
    { name: "json", help: "print the report as the listener serves it, JSON (--json alone means true)", default: "false" },
  ]);
  if (positional.length !== 1)
    throw new UsageError(`git-csi report: name exactly one volume (its volumeHandle), not ${positional.length}\nusage: git-csi report <volume> [--metrics-address host:port] [--json]`);
  if (flags.json !== "true" && flags.json !== "false") throw new UsageError(`git-csi report: --json is true or false, not ${flags.json}`);
  try {
    const { raw, report } = await fetchReport(flags["metrics-address"]!, positional[0]!);
    process.stdout.write(flags.json === "true" ? raw : formatReport(report));
  } catch (err) {
    if (!(err instanceof ReportError)) throw err;
    process.stderr.write(`git-csi report: ${err.message}\n`);
    process.exitCode = 1;
  }
}
