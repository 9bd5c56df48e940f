const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** A Go-style duration as Kubernetes users write it: "30s", "5m", "1h30m", "250ms". */
export function parseDuration(text: string): number | undefined {
  const t = text.trim();
  if (!/^(\d+(\.\d+)?(ms|s|m|h))+$/.test(t)) return undefined;
  let ms = 0;
  for (const [, value, unit] of t.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g)) ms += Number(value) * UNIT_MS[unit!]!;
  return Math.round(ms);
}

export function formatDuration(ms: number): string {
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  if (ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}

const QUANTITY: Record<string, number> = { "": 1, k: 1e3, M: 1e6, G: 1e9, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3 };

/** A Kubernetes quantity of bytes: "1Mi", "500k", "1048576". */
export function parseQuantity(text: string): number | undefined {
  const m = text.trim().match(/^(\d+)(|k|M|G|Ki|Mi|Gi)$/);
  return m ? Number(m[1]) * QUANTITY[m[2]!]! : undefined;
}
