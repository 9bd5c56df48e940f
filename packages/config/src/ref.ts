import { createHash } from "node:crypto";

/**
 * Characters no ref may hold, from git's refname_disposition: control
 * characters, space, DEL, `~ ^ : ? [ \` and `*` (a refspec pattern).
 */
// eslint-disable-next-line no-control-regex -- control characters are what a ref name may not hold
const REF_FORBIDDEN = /[\x00-\x20\x7f~^:?*[\\]/;

/** git check-ref-format's rules for a full ref name such as refs/heads/main. */
function isRefName(ref: string): boolean {
  // '/' splits components, so "..", "@{" and a final "." are all within one.
  if (REF_FORBIDDEN.test(ref) || ref.includes("..") || ref.includes("@{") || ref.endsWith(".")) return false;
  return ref.split("/").every((c) => c !== "" && !c.startsWith(".") && !c.endsWith(".lock"));
}

/**
 * What `git check-ref-format --branch` accepts outside a repository: a name
 * that is not HEAD, does not start with '-' (it would read as an option), and
 * makes refs/heads/<name> a valid ref.
 */
export function isBranchName(name: string): boolean {
  return !name.startsWith("-") && name !== "HEAD" && isRefName(`refs/heads/${name}`);
}

/** A name that makes refs/tags/<name> a valid ref, and is no option. */
export function isTagName(name: string): boolean {
  return !name.startsWith("-") && isRefName(`refs/tags/${name}`);
}

/**
 * The branch a volume follows, from its `ref` attribute: `main` or
 * `refs/heads/main`. Undefined when the ref is not a branch git would accept,
 * checked by git check-ref-format's rules without running git on the input.
 */
export function branchOf(ref: string): string | undefined {
  if (ref.startsWith("refs/") && !ref.startsWith("refs/heads/")) return undefined;
  const branch = ref.startsWith("refs/heads/") ? ref.slice("refs/heads/".length) : ref;
  return isBranchName(branch) ? branch : undefined;
}

export const BRANCH_RULE =
  "must name a branch as git check-ref-format --branch accepts it (not HEAD, not starting with '-', without '..', '@{', spaces, control characters or any of ~^:?*[\\, no part starting with '.' or ending in '.lock'), such as main or refs/heads/main";

/** What a read-only volume's `ref` names: a branch it may follow, or a tag or commit that pins it. */
export type ReaderRef = { kind: "branch"; branch: string } | { kind: "tag"; tag: string } | { kind: "commit"; commit: string };

/** A full commit id; an abbreviation would name different commits as the repository grows. */
const COMMIT_ID = /^[0-9a-fA-F]{40}$/;

/**
 * A read-only volume's ref: 40 hex digits are a commit, `refs/tags/<tag>` a
 * tag, anything else a branch as branchOf takes it. A bare name is always a
 * branch, so what a volume serves never depends on what the remote holds.
 */
export function readerRefOf(ref: string): ReaderRef | undefined {
  if (COMMIT_ID.test(ref)) return { kind: "commit", commit: ref.toLowerCase() };
  if (ref.startsWith("refs/tags/")) return isRefName(ref) ? { kind: "tag", tag: ref.slice("refs/tags/".length) } : undefined;
  const branch = branchOf(ref);
  return branch === undefined ? undefined : { kind: "branch", branch };
}

/**
 * The node's name for the read-only volumes of one URL and ref, however the
 * ref is written (`main` and `refs/heads/main` are one branch): they share
 * one view of the ref, one checkout per commit and one fetch per interval.
 * A hash, so that it is one path segment and one ref name part.
 */
export function readerKeyOf(url: string, ref: string): string | undefined {
  const target = readerRefOf(ref);
  if (target === undefined) return undefined;
  const name = target.kind === "branch" ? `refs/heads/${target.branch}` : target.kind === "tag" ? `refs/tags/${target.tag}` : target.commit;
  return createHash("sha256").update(`${url}\n${name}`).digest("hex").slice(0, 32);
}

export const READER_REF_RULE =
  "must name a branch (main or refs/heads/main), a tag as refs/tags/<tag>, or a commit by its full 40-hex id, as git check-ref-format accepts a ref (not HEAD, not starting with '-', without '..', '@{', spaces, control characters or any of ~^:?*[\\, no part starting with '.' or ending in '.lock')";

/** Why a writer cannot take a tag or a commit: it pushes to its ref. */
const WRITER_PIN_RULE = "a writer volume (ReadWriteOnce, ReadWriteOncePod) pushes to its ref, so it must be a branch; a tag or a commit pin is taken only by a read-only volume (ReadOnlyMany)";

/**
 * What is wrong with a volume's ref, as the rest of a message after the
 * quoted ref, or undefined when the volume may take it. A reader takes a
 * branch, a tag or a commit; a writer only a branch, and a 40-hex name is a
 * commit for both, never a branch.
 */
export function refProblem(ref: string, reader: boolean): string | undefined {
  const named = readerRefOf(ref);
  if (reader) return named ? undefined : READER_REF_RULE;
  if (named === undefined) return BRANCH_RULE;
  return named.kind === "branch" ? undefined : `names a ${named.kind}; ${WRITER_PIN_RULE}`;
}
