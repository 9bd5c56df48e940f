/**
 * The transports a volume's repository may be reached by: the ones forges
 * serve. git's own names, as its protocol.<name>.allow settings take them.
 */
export const REMOTE_TRANSPORTS = ["ssh", "git", "http", "https"] as const;

const MAX_URL_LENGTH = 2048;
/** A host name or an IP address in brackets; never one that starts with '-', which ssh would read as an option. */
const HOST = String.raw`(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)`;
/** A path: anything but white space, control characters and brackets (git would read "@[" as a host's start). */
const PATH = String.raw`[^\s\x00-\x1f\x7f[\]]+`;
const URL_FORM = new RegExp(String.raw`^(?:ssh|git|https?)://(?:[^@/\s\x00-\x1f\x7f]+@)?${HOST}(?::\d{1,5})?/${PATH}$`);
/**
 * git's scp-like ssh form: no '/' before the first ':', no "://" anywhere
 * (git would read a URL), no helper's "::", no path that reads as an option.
 */
const SCP_FORM = new RegExp(String.raw`^(?!.*://)(?:[A-Za-z0-9._~+][A-Za-z0-9._~+-]*@)?${HOST}:(?![:-])${PATH}$`);

const URL_RULE = `must be a remote git URL of at most ${MAX_URL_LENGTH} characters: ssh://, git://, https:// or http:// with a host and a path, or scp-like user@host:path`;

/** Why a URL that is no remote one is refused: what it would reach. */
function refusal(url: string): string {
  if (/^[A-Za-z0-9+.-]+::/.test(url)) return `; ${url.slice(0, url.indexOf("::"))}:: is a helper transport, which runs a program on the node`;
  if (/^file:/i.test(url) || /^[./~]/.test(url)) return "; a local path or file:// URL would read the node's own files, which hold every volume's repository";
  if (url.startsWith("-")) return "; a URL that starts with '-' would read as an option";
  return "";
}

/**
 * Undefined for a URL of a remote transport; otherwise the rule it breaks.
 * Local paths, file:// and helper transports (ext::, fd::) are refused: the
 * node's state directory holds the repositories, work trees and unpushed
 * commits of every volume on the node, and a forge never needs them.
 */
export function remoteUrlProblem(url: string): string | undefined {
  if (url.length <= MAX_URL_LENGTH && (URL_FORM.test(url) || SCP_FORM.test(url))) return undefined;
  return `${URL_RULE}${refusal(url)}`;
}
