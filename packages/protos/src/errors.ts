import { status } from "@grpc/grpc-js";

/**
 * An error as a value: a gRPC status code that the CO acts on and a message
 * that tells the operator what was wrong and what is accepted instead.
 */
export class CsiError extends Error {
  constructor(
    readonly code: status,
    message: string,
  ) {
    super(message);
    this.name = "CsiError";
  }
}

export const invalidArgument = (message: string) => new CsiError(status.INVALID_ARGUMENT, message);
export const notFound = (message: string) => new CsiError(status.NOT_FOUND, message);
export const alreadyExists = (message: string) => new CsiError(status.ALREADY_EXISTS, message);
export const failedPrecondition = (message: string) => new CsiError(status.FAILED_PRECONDITION, message);
export const unavailable = (message: string) => new CsiError(status.UNAVAILABLE, message);
export const internal = (message: string) => new CsiError(status.INTERNAL, message);

/** A field that must be set: the message names the field. */
export function required<T>(value: T | undefined | null | "", field: string): T {
  if (value === undefined || value === null || value === "") throw invalidArgument(`${field} is required`);
  return value;
}

/** Any thrown thing as a CsiError; a gRPC error from a downstream service keeps its code. */
export function asCsiError(err: unknown): CsiError {
  if (err instanceof CsiError) return err;
  const maybe = err as { code?: unknown; details?: unknown; message?: unknown };
  if (typeof maybe?.code === "number" && maybe.code in status) {
    return new CsiError(maybe.code as status, String(maybe.details ?? maybe.message ?? "error"));
  }
  return internal(err instanceof Error ? err.message : String(err));
}
