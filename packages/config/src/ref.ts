/**
 * The branch a volume follows, from its `ref` attribute: `main` or
 * `refs/heads/main`. Undefined when the ref is not a branch git would accept,
 * checked by git check-ref-format's rules without running git on the input.
 */
export function branchOf(ref: string): string | undefined {
  if (ref.startsWith("refs/") && !ref.startsWith("refs/heads/")) return undefined;
  const branch = ref.startsWith("refs/heads/") ? ref.slice("refs/heads/".length) : ref;
  const valid =
    branch !== "" &&
    !/[\x00-\x20\x7f~^:?*[\\]/.test(branch) &&
    !branch.includes("..") &&
    !branch.includes("@{") &&
    !branch.endsWith(".") &&
    branch.split("/").every((c) => c !== "" && !c.startsWith(".") && !c.endsWith(".lock"));
  return valid ? branch : undefined;
}

export const BRANCH_RULE = "must name a branch, such as main or refs/heads/main";
