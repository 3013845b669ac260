/**
 * The logger the library accepts: any pino-compatible object (`pino()`, a child logger, or your
 * own). Silent by default: the library never writes to the console.
 */
export interface Logger {
  /** Detail for debugging (a consumer group's watch that could not read the broker). */
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

/**
 * The logger an option names, checked before any I/O: absent (undefined or null) is the silent
 * one; otherwise an object whose `info`, `warn` and `error` are functions (the levels the library
 * calls). @internal
 */
export function resolveLogger(logger: unknown, name = 'logger'): Logger {
  if (logger === undefined || logger === null) return silentLogger;
  const l = logger as Partial<Record<keyof Logger, unknown>>;
  if (
    typeof logger !== 'object' ||
    typeof l.info !== 'function' ||
    typeof l.warn !== 'function' ||
    typeof l.error !== 'function'
  ) {
    throw new TypeError(`Expected ${name} to be a pino-compatible logger (info, warn and error functions)`);
  }
  return logger as Logger;
}
