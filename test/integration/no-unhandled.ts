import { EventEmitter } from 'node:events';
import { readFileSync, writeFileSync } from 'node:fs';
import pg from 'pg';
import { afterEach } from 'vitest';

// Fails the test during which any process failed with an unhandled rejection or an uncaught
// exception: the test process itself, and every process it started (test/support/unhandled-guard.mjs
// records theirs). A library that crashes its host is broken even when the test's own assertions pass.
const log = process.env.STREAM_DEDUP_UNHANDLED_LOG;
const here: string[] = [];
process.on('unhandledRejection', (err) =>
  here.push(`unhandledRejection: ${String((err as Error)?.stack ?? err)}`),
);
process.on('uncaughtException', (err) => here.push(`uncaughtException: ${String(err?.stack ?? err)}`));

// Which emitter threw: an 'error' emitted with no listener becomes an uncaught exception whose stack
// names only the parser that made the error (CI, 2026-12-05: a pg error from a PostgreSQL restart,
// its client unknown). Each pg client remembers where it was connected from (the pool's caller).
// Kept apart and shown only with an uncaught exception: code that emits 'error' inside its own
// try/catch must not fail a test here.
const unlistened: string[] = [];
const connectedFrom = new WeakMap<object, string>();
// eslint-disable-next-line @typescript-eslint/unbound-method -- called with its own `this` below
const connect = pg.Client.prototype.connect;
pg.Client.prototype.connect = function (this: pg.Client, ...args: unknown[]) {
  connectedFrom.set(this, new Error('connected from').stack ?? '');
  return (connect as (...a: unknown[]) => unknown).apply(this, args);
} as typeof connect;
// eslint-disable-next-line @typescript-eslint/unbound-method -- called with its own `this` below
const emit = EventEmitter.prototype.emit;
EventEmitter.prototype.emit = function (this: EventEmitter, type: string | symbol, ...args: unknown[]) {
  if (type === 'error' && this.listenerCount('error') === 0) {
    unlistened.push(
      `'error' emitted with no listener on a ${this.constructor.name}: ${String((args[0] as Error)?.message)}\n` +
        `${connectedFrom.get(this) ?? '(not a pg client)'}\n${new Error('emitted at').stack ?? ''}`,
    );
  }
  return emit.call(this, type, ...args);
};

afterEach(() => {
  let children = '';
  if (log !== undefined) {
    try {
      children = readFileSync(log, 'utf8');
    } catch {
      children = '';
    }
    if (children.length > 0) writeFileSync(log, '');
  }
  const mine = here.splice(0);
  const emitted = unlistened.splice(0);
  if (children.length > 0 || mine.length > 0) {
    throw new Error(
      `unhandled errors during this test:\n${[...mine, children, ...emitted].filter((s) => s.length > 0).join('\n')}`,
    );
  }
});
