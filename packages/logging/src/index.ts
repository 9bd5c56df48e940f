import winston from "winston";

export type Logger = winston.Logger;

/**
 * One JSON line per event, on stderr so stdout stays free for a launcher's own
 * output. Lines carry volume, claim and operation fields where they apply;
 * never a secret or a session record's contents: callers log identities, not payloads.
 */
export function createLogger(service: string, level = process.env.GIT_CSI_LOG_LEVEL ?? "info"): Logger {
  return winston.createLogger({
    level,
    defaultMeta: { service },
    format: winston.format.combine(winston.format.timestamp(), winston.format.errors({ stack: false }), winston.format.json()),
    transports: [new winston.transports.Console({ stderrLevels: Object.keys(winston.config.npm.levels) })],
  });
}

/** Logs start-up and a clean shutdown on SIGTERM/SIGINT, and every fatal failure, as JSON lines. */
export function logLifecycle(logger: Logger, stop: () => Promise<void>): void {
  const shutdown = (signal: string) => {
    logger.info("shutting down", { operation: "shutdown", signal });
    stop().then(
      () => {
        logger.info("stopped", { operation: "shutdown" });
        process.exit(0);
      },
      (err: unknown) => {
        logger.error("shutdown failed", { operation: "shutdown", error: String(err) });
        process.exit(1);
      },
    );
  };
  process.once("SIGTERM", () => shutdown("SIGTERM"));
  process.once("SIGINT", () => shutdown("SIGINT"));
  process.on("uncaughtException", (err) => {
    logger.error("uncaught exception", { operation: "crash", error: err.stack ?? String(err) });
    process.exit(1);
  });
  process.on("unhandledRejection", (err) => {
    logger.error("unhandled rejection", { operation: "crash", error: err instanceof Error ? (err.stack ?? err.message) : String(err) });
    process.exit(1);
  });
}
