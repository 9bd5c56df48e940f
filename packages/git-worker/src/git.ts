import { GitError, type SimpleGit } from "simple-git";

/** How many of a command's arguments an error shows: a pathspec list can hold thousands. */
const ARGV_SHOWN = 12;

/** A git command that failed, with its argv and git's own words: what an operator needs to act. */
export class GitCommandError extends Error {
  constructor(
    readonly argv: string[],
    readonly stderr: string,
  ) {
    const shown = argv.length > ARGV_SHOWN ? [...argv.slice(0, ARGV_SHOWN), `… (${argv.length - ARGV_SHOWN} more)`] : argv;
    super(`git ${shown.join(" ")}: ${stderr}`);
  }
}

/**
 * Runs one git command. git says "absent" by an exit code with nothing on
 * stderr, which simple-git answers as empty output; every other failure
 * rejects, and carries the argv.
 */
export async function runGit(git: SimpleGit, argv: string[]): Promise<string> {
  try {
    return await git.raw(argv);
  } catch (err) {
    throw new GitCommandError(argv, (err instanceof GitError ? err.message : String(err)).trim());
  }
}
