/**
 * The logger the library accepts: any pino-compatible object (`pino()`, a child logger, or your
 * own). Silent by default: the library never writes to the console.
 */
export interface Logger {
  /** Detail for debugging (not used by the library today). */
  debug(obj: object, msg?: string): void;
  /** Opens, reconnects, closes. */
  info(obj: object, msg?: string): void;
  /** Lost connections, confirm timeouts, resubscriptions: the library recovers. */
  warn(obj: object, msg?: string): void;
  /** A publisher or consumer stopped on an error (the error is in `obj.err`). */
  error(obj: object, msg?: string): void;
}

const noop = (): void => undefined;

/** The default: discards everything. */
export const silentLogger: Logger = { debug: noop, info: noop, warn: noop, error: noop };
