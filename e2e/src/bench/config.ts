// The bench's command line and what each section measures, full or --quick.
import * as path from "node:path";
import { parseArgs } from "node:util";
import type { ScaleConfig } from "./scale";

export const REPO_ROOT = path.join(__dirname, "..", "..", "..", "..");
const DEFAULT_OUT = path.join(REPO_ROOT, "bench", "results");
export const MiB = 1024 * 1024;
/** Section 2's trees: directories of this many files of FILE_BYTES each. */
export const FILES_PER_DIR = 1000;
export const FILE_BYTES = 100;

export interface Config {
  quick: boolean;
  passthroughOnly: boolean;
  commitOnly: boolean;
  scaleOnly: boolean;
  /** Sections 1 and 2 only: the scale section alone takes about 10 minutes. */
  noScale: boolean;
  /** Section 2 on its 1,000-file tree alone: issue 29's commit-path row, in about a minute. */
  commitPath: boolean;
  scale: ScaleConfig;
  out: string;
  seqMiB: number;
  files: number;
  /** Rows the SQLite workload inserts. */
  rows: number;
  repetitions: number;
  commit: CommitConfig;
}

export interface CommitConfig {
  /** The trees, small first; every directory holds FILES_PER_DIR files, so only the number of directories differs. */
  trees: number[];
  repetitions: number;
  quiesceMs: number;
}

export function parseConfig(argv: string[]): Config {
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: "boolean", default: false },
      "passthrough-only": { type: "boolean", default: false },
      "commit-only": { type: "boolean", default: false },
      "scale-only": { type: "boolean", default: false },
      "no-scale": { type: "boolean", default: false },
      "commit-path": { type: "boolean", default: false },
      out: { type: "string" },
    },
    strict: true,
  });
  const quick = values.quick === true;
  const commitPath = values["commit-path"] === true;
  return {
    quick,
    passthroughOnly: values["passthrough-only"] === true,
    commitOnly: commitPath || values["commit-only"] === true,
    commitPath,
    scaleOnly: values["scale-only"] === true,
    noScale: values["no-scale"] === true,
    scale: { volumes: quick ? 20 : 200, idleMs: quick ? 20_000 : 60_000 },
    out: path.resolve(values.out ?? DEFAULT_OUT),
    seqMiB: quick ? 64 : 1024,
    files: quick ? 1000 : 10_000,
    rows: quick ? 5000 : 50_000,
    repetitions: quick ? 1 : 3,
    commit: { trees: commitPath ? [FILES_PER_DIR] : [FILES_PER_DIR, quick ? 10_000 : 100_000], repetitions: commitPath ? 10 : quick ? 3 : 5, quiesceMs: 1000 },
  };
}
