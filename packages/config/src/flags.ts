import { parseDuration } from "./duration";

/** One command-line flag of an executable: its name, what it is for, and its default. */
export interface FlagSpec {
  name: string;
  help: string;
  default?: string;
  required?: boolean;
}

export class UsageError extends Error {}

/**
 * `--name value` or `--name=value`; `--help` prints usage. Unknown and missing
 * flags are errors that name the flag, so a typo in a manifest fails loudly.
 */
export function parseFlags(argv: string[], command: string, summary: string, specs: FlagSpec[]): Record<string, string> {
  const usage = [`usage: ${command} [flags]`, "", summary, "", "flags:"]
    .concat(specs.map((s) => `  --${s.name.padEnd(18)} ${s.help}${s.default !== undefined ? ` (default ${s.default})` : s.required ? " (required)" : ""}`))
    .join("\n");
  const values: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--help" || arg === "-h") {
      process.stdout.write(`${usage}\n`);
      process.exit(0);
    }
    const m = arg.match(/^--([^=]+)(?:=(.*))?$/);
    const spec = m && specs.find((s) => s.name === m[1]);
    if (!m || !spec) throw new UsageError(`${command}: unknown argument ${arg}\n${usage}`);
    const value = m[2] ?? argv[++i];
    if (value === undefined) throw new UsageError(`${command}: --${spec.name} needs a value`);
    values[spec.name] = value;
  }
  for (const s of specs) {
    if (values[s.name] === undefined && s.default !== undefined) values[s.name] = s.default;
    if (values[s.name] === undefined && s.required) throw new UsageError(`${command}: --${s.name} is required\n${usage}`);
  }
  return values;
}

/** A flag that holds a positive duration, in milliseconds; anything else is a usage error naming the flag. */
export function durationFlag(flags: Record<string, string>, name: string): number {
  const ms = parseDuration(flags[name]!);
  if (ms === undefined || ms <= 0) throw new UsageError(`--${name} ${JSON.stringify(flags[name])} must be a positive duration such as 90s or 1m30s`);
  return ms;
}

/** A flag that is true or false; anything else is a usage error naming the flag. */
export function booleanFlag(flags: Record<string, string>, name: string): boolean {
  const value = flags[name];
  if (value === "true" || value === "false") return value === "true";
  throw new UsageError(`--${name} ${JSON.stringify(value)} must be true or false`);
}

/**
 * Runs an executable's main: a usage error prints its text and exits 2; any
 * other failure to start is one JSON log line and exit 1.
 */
export function runMain(service: string, main: () => Promise<void>): void {
  main().catch((err: unknown) => {
    const usage = err instanceof UsageError;
    process.stderr.write(`${usage ? err.message : JSON.stringify({ level: "error", service, operation: "startup", message: String(err) })}\n`);
    process.exit(usage ? 2 : 1);
  });
}
