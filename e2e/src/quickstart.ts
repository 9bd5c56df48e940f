// Test helper: the README's own commands, as a reader runs them. The fenced
// ```sh blocks of the named sections are run in order by bash -euo pipefail,
// unchanged but for the lines that set a value the reader chooses (`export
// NAME=…`, which the README says are theirs): the test sets those itself.
import { readFileSync } from "node:fs";
import * as path from "node:path";

const ROOT = path.join(__dirname, "..", "..", "..");

/** The sections of README.md a newcomer follows to install the driver and make a first volume. */
export const QUICK_START_SECTIONS = ["Install from a registry", "Quick start"];

/** The sh blocks of each `## <section>` of the markdown, in order, without their `export` lines; throws naming a section it does not find. */
export function shellBlocks(markdown: string, sections: string[]): string[] {
  return sections.flatMap((section) => {
    const start = markdown.search(new RegExp(`^## ${section.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}$`, "m"));
    if (start < 0) throw new Error(`README.md has no section '## ${section}'`);
    const rest = markdown.slice(start + 3);
    const end = rest.search(/^## /m);
    const body = end < 0 ? rest : rest.slice(0, end);
    const blocks = [...body.matchAll(/^```sh\n([\s\S]*?)^```$/gm)].map((m) => m[1]!.replace(/^export [A-Z_]+=.*\n/gm, ""));
    if (blocks.length === 0) throw new Error(`README.md's '## ${section}' has no sh block`);
    return blocks;
  });
}

/** The whole script the README's quick start amounts to, run from the repository's root. */
export function quickStartScript(): string {
  const blocks = shellBlocks(readFileSync(path.join(ROOT, "README.md"), "utf8"), QUICK_START_SECTIONS);
  return [`cd ${JSON.stringify(ROOT)}`, ...blocks].join("\n");
}
