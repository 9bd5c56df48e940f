export * from "./client";
export * from "./class-watch";
export * from "./events";
export type { Backoff } from "./watched";
export * from "./volumes";
export * from "./pods";
