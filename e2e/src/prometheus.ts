// A real Prometheus for tests (Debian's prometheus package): it scrapes the
// driver's listeners as the chart's ServiceMonitor does, evaluates rule files,
// and answers queries, rules and alerts over its HTTP API.
import { existsSync } from "node:fs";
import * as fs from "node:fs/promises";
import * as path from "node:path";
import { helmTemplate } from "./chart";
import { freePort, run } from "./driver";
import { until, watched } from "./kube";

export const PROMETHEUS = "/usr/bin/prometheus";
export const PROMTOOL = "/usr/bin/promtool";

/** Why Prometheus cannot run here, or undefined when it can. */
export function prometheusMissing(): string | undefined {
  const missing = [PROMETHEUS, PROMTOOL].filter((f) => !existsSync(f));
  return missing.length ? `no ${missing.join(", ")}: Debian's prometheus package ('make apt')` : undefined;
}

/** One listener to scrape, with the labels the ServiceMonitor would add (node). */
export interface ScrapeTarget {
  job: string;
  address: string;
  labels?: Record<string, string>;
}

export interface Sample {
  metric: Record<string, string>;
  value: [number, string];
}

export interface Alert {
  labels: Record<string, string>;
  annotations: Record<string, string>;
  state: "pending" | "firing";
}

export interface AlertingRule {
  name: string;
  /** The rule's `for`, in seconds. */
  duration: number;
  health: string;
  lastEvaluation: string;
}

export interface Prometheus {
  query(promql: string): Promise<Sample[]>;
  alerts(): Promise<Alert[]>;
  rules(): Promise<AlertingRule[]>;
  /** Polls probe until it is true; fails early, with Prometheus's log, if Prometheus exits. */
  until(what: string, probe: () => Promise<boolean>, timeoutMs?: number): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts Prometheus in dir, scraping every second (honor_labels, as the
 * ServiceMonitor) and evaluating the rule files every second; resolves once
 * it is ready. promtool checks the configuration first.
 */
export async function startPrometheus(dir: string, targets: ScrapeTarget[], ruleFiles: string[] = []): Promise<Prometheus> {
  await fs.mkdir(dir, { recursive: true });
  const config = path.join(dir, "prometheus.yml");
  // JSON is YAML.
  const scrapeConfigs = targets.map((t) => ({ job_name: t.job, honor_labels: true, static_configs: [{ targets: [t.address], labels: t.labels ?? {} }] }));
  await fs.writeFile(config, JSON.stringify({ global: { scrape_interval: "1s", evaluation_interval: "1s" }, rule_files: ruleFiles, scrape_configs: scrapeConfigs }, null, 2));
  await run(PROMTOOL, ["check", "config", config]);
  const web = `127.0.0.1:${await freePort()}`;
  const server = await watched(
    PROMETHEUS,
    [`--config.file=${config}`, `--storage.tsdb.path=${path.join(dir, "data")}`, `--web.listen-address=${web}`, "--log.level=warn"],
    path.join(dir, "prometheus.log"),
  );
  const api = async <T>(route: string): Promise<T> => {
    const body = (await (await fetch(`http://${web}/api/v1/${route}`)).json()) as { status: string; data: T; error?: string };
    if (body.status !== "success") throw new Error(`${route}: ${body.error}`);
    return body.data;
  };
  const prometheus: Prometheus = {
    query: async (promql) => (await api<{ result: Sample[] }>(`query?query=${encodeURIComponent(promql)}`)).result,
    alerts: async () => (await api<{ alerts: Alert[] }>("alerts")).alerts,
    rules: async () => (await api<{ groups: { rules: AlertingRule[] }[] }>("rules?type=alert")).groups.flatMap((g) => g.rules),
    until: (what, probe, timeoutMs) => until(what, server, probe, timeoutMs),
    stop: () => server.stop(),
  };
  try {
    await prometheus.until("Prometheus is ready", async () => (await fetch(`http://${web}/-/ready`)).ok);
  } catch (err) {
    await server.stop();
    throw err;
  }
  return prometheus;
}

/**
 * The chart's alert rules as a Prometheus rules file: the spec of the
 * PrometheusRule that helm renders with metrics.prometheusRule.enabled,
 * written to dir/rules.yaml. The spec is the document's last key, so it is
 * the lines after `spec:`, less their two spaces of indentation.
 */
export async function renderedAlertRules(dir: string): Promise<string> {
  const rendered = await helmTemplate("git-csi", ["--set", "metrics.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml"]);
  const lines = rendered.split("\n");
  const spec = lines.indexOf("spec:");
  if (spec < 0) throw new Error(`helm rendered no PrometheusRule spec:\n${rendered}`);
  const file = path.join(dir, "rules.yaml");
  await fs.mkdir(dir, { recursive: true });
  await fs.writeFile(
    file,
    lines
      .slice(spec + 1)
      .map((l) => l.replace(/^ {2}/, ""))
      .join("\n"),
  );
  return file;
}
