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
