/** ENOENT or ENOTDIR: the path is not there, which is an answer; every other errno is a failure. */
export function isAbsent(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === "ENOENT" || code === "ENOTDIR";
}

/** A file system look-up whose path is absent answers undefined; a look-up that failed stays an error. */
export async function orAbsent<T>(lookup: Promise<T>): Promise<T | undefined> {
  try {
    return await lookup;
  } catch (err) {
    if (isAbsent(err)) return undefined;
    throw err;
  }
}
