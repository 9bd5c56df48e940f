import { formatDuration, parseDuration, parseQuantity } from "./duration";

/**
 * A VolumeAttributesClass's parameters: the cluster owner's commit and push
 * policy for the volumes whose claims name the class. Spec 004, "The class".
 */
export interface ClassPolicy {
  /** How long the tree must be quiet before the driver commits. */
  quiesceMs: number;
  /** How old the oldest unpushed commit may grow before the driver pushes. */
  maxLatencyMs: number;
  /** Larger files are skipped, never committed. */
  maxFileSizeBytes: number;
  /** `Name <email>` on every commit. */
  author: { name: string; email: string };
  /** gitignore patterns on top of the repository's own .gitignore. */
  ignore: string[];
  /** How often a read-only volume fetches its ref and serves a new commit; unset, it serves the commit of its stage. */
  followMs?: number;
}

interface ParameterRule {
  /** The values the parameter takes, for the class reference and error messages. */
  rule: string;
  default: string;
  apply(value: string, policy: ClassPolicy): string | undefined;
}

const SECOND = 1000;
const DAY = 24 * 3_600_000;

function durationRule(key: "quiesceMs" | "maxLatencyMs" | "followMs", min: number, max: number): ParameterRule["apply"] {
  return (value, policy) => {
    const ms = parseDuration(value);
    if (ms === undefined || ms < min || ms > max) return `a duration such as 30s or 5m, from ${formatDuration(min)} to ${formatDuration(max)}`;
    policy[key] = ms;
    return undefined;
  };
}

/** The class reference: every parameter, its values and its default. The README's table is this table. */
const CLASS_PARAMETERS: Record<string, ParameterRule> = {
  "push.quiesce": {
    rule: "a duration from 1s to 1h",
    default: "30s",
    apply: durationRule("quiesceMs", SECOND, 3_600_000),
  },
  "push.maxLatency": {
    rule: "a duration from 1s to 24h, not shorter than push.quiesce",
    default: "5m",
    apply: durationRule("maxLatencyMs", SECOND, DAY),
  },
  "commit.maxFileSize": {
    rule: "a size in bytes from 1 to 1Gi, such as 1Mi or 500k",
    default: "10Mi",
    apply: (value, policy) => {
      const bytes = parseQuantity(value);
      if (bytes === undefined || bytes < 1 || bytes > 1024 ** 3) return "a size in bytes from 1 to 1Gi, such as 1Mi or 500k";
      policy.maxFileSizeBytes = bytes;
      return undefined;
    },
  },
  "commit.author": {
    rule: "Name <email>, as git writes an author",
    default: "git.liken.sh <git-csi@git.liken.sh>",
    apply: (value, policy) => {
      const m = value.match(/^([^<>\n]+?)\s*<([^<>\s]+@[^<>\s]+)>$/);
      if (!m) return "Name <email>, as git writes an author, such as: Home Assistant <homeassistant@home.example>";
      policy.author = { name: m[1]!.trim(), email: m[2]! };
      return undefined;
    },
  },
  ignore: {
    rule: "comma-separated gitignore patterns, such as .storage/,*.db*,*.log",
    default: "(none)",
    apply: (value, policy) => {
      // Checked before trimming: a line break at a pattern's end is still one, never quietly dropped.
      if (/[\n\r\0]/.test(value)) return "comma-separated gitignore patterns without line breaks";
      policy.ignore = value
        .split(",")
        .map((p) => p.trim())
        .filter((p) => p !== "");
      return undefined;
    },
  },
  "follow.interval": {
    rule: "a duration from 1s to 24h; only a read-only volume follows, a writer ignores it",
    default: "(none: a read-only volume serves the commit of its stage)",
    apply: durationRule("followMs", SECOND, DAY),
  },
};

/** gRPC's code for InvalidArgument; config depends on no transport. */
const INVALID_ARGUMENT = 3;

export class ClassParameterError extends Error {
  /** A bad parameter is the caller's: each service's error conversion (asCsiError) answers it as InvalidArgument. */
  readonly code = INVALID_ARGUMENT;

  constructor(
    readonly parameter: string,
    readonly rule: string,
  ) {
    super(`class parameter ${parameter}: ${rule}`);
    this.name = "ClassParameterError";
  }
}

export function defaultPolicy(): ClassPolicy {
  return {
    quiesceMs: 30 * SECOND,
    maxLatencyMs: 5 * 60 * SECOND,
    maxFileSizeBytes: 10 * 1024 ** 2,
    author: { name: "git.liken.sh", email: "git-csi@git.liken.sh" },
    ignore: [],
  };
}

/**
 * The policy a class's parameters ask for, on top of the defaults. A bad or
 * unknown parameter throws a ClassParameterError naming it and its rule, and
 * nothing is applied: the caller keeps the policy it had.
 */
export function parseClassParameters(parameters: Record<string, string>): ClassPolicy {
  const policy = defaultPolicy();
  for (const [name, value] of Object.entries(parameters)) {
    const parameter = CLASS_PARAMETERS[name];
    if (!parameter) throw new ClassParameterError(name, `unknown parameter; the class takes ${Object.keys(CLASS_PARAMETERS).join(", ")}`);
    const problem = parameter.apply(value, policy);
    if (problem) throw new ClassParameterError(name, `${JSON.stringify(value)} is not ${problem}`);
  }
  if (policy.maxLatencyMs < policy.quiesceMs) {
    throw new ClassParameterError("push.maxLatency", `${formatDuration(policy.maxLatencyMs)} is shorter than push.quiesce ${formatDuration(policy.quiesceMs)}`);
  }
  return policy;
}
