/**
 * The logger the library accepts: any pino-compatible object (`pino()`, a child logger, or your
 * own). Silent by default: the library never writes to the console.
 */
export interface Logger {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

const noop = (): void => undefined;

/** The default: discards everything. */
export const silentLogger: Logger = { debug: noop, info: noop, warn: noop, error: noop };
