/**
 * A scripted stand-in for pg's Client, for the real pg-pool (`new pg.Pool({ Client })`): the part of
 * pg.Client that pg-pool uses, with handshakes that take a set time and may end the way pg ends one
 * when a new connection's ReadyForQuery and a dying server's FATAL come in one socket read — the
 * handshake's callback (pg-pool hands the client over inside it), then 'error' in the same turn.
 * Used by test/postgres/checkout.test.ts and property-tests/pool-checkout.test.ts.
 */
import { EventEmitter } from 'node:events';
import pg from 'pg';

/** How the next handshake goes. */
export interface Handshake {
  /** ms until it completes; undefined: within connect() itself. */
  readonly ms?: number;
  /** 'fatal': an 'error' emitted right after the hand-over, in the same turn. */
  readonly then?: 'fatal' | 'nothing';
}

/** One scripted pool and what it made. */
export interface ScriptedPool {
  readonly pool: pg.Pool;
  readonly clients: ScriptedClient[];
  /** How the next handshakes go (shifted per client; `fallback` once it is empty). */
  readonly handshakes: Handshake[];
  fallback: Handshake;
  /**
   * Errors thrown out of an 'error' emit that found no listener: in pg that throw leaves the
   * socket's data handler, an uncaught exception in the host process.
   */
  readonly uncaught: unknown[];
}

export class ScriptedClient extends EventEmitter {
  _queryable = true;
  _ending = false;
  /** 'error' events emitted so far. */
  emitted = 0;
  constructor(private readonly script: ScriptedPool) {
    super();
    script.clients.push(this);
  }
  connect(callback: (err?: Error) => void): void {
    const { ms, then } = this.script.handshakes.shift() ?? this.script.fallback;
    const finish = (): void => {
      callback();
      if (then === 'fatal') this.fail(new Error('terminating connection due to unexpected postmaster exit'));
    };
    if (ms === undefined) finish();
    else setTimeout(finish, ms);
  }
  /** The server ends the session: the client is not queryable any more, and 'error' is emitted. */
  fail(err: Error): void {
    this._queryable = false;
    this.emitted++;
    try {
      this.emit('error', err);
    } catch (thrown) {
      this.script.uncaught.push(thrown);
    }
  }
  end(callback?: () => void): void {
    this._ending = true;
    this.emit('end');
    callback?.();
  }
  ref(): void {}
  unref(): void {}
}

/** A real pg-pool of at most `max` scripted clients, its 'error' event heard. */
export function scriptedPool(max = 1): ScriptedPool {
  const script: ScriptedPool = {
    pool: undefined as unknown as pg.Pool,
    clients: [],
    handshakes: [],
    fallback: {},
    uncaught: [],
  };
  const Client = function (this: unknown) {
    return new ScriptedClient(script);
  } as unknown as typeof pg.Client;
  const pool = new pg.Pool({ Client, max });
  pool.on('error', () => undefined);
  Object.assign(script, { pool });
  return script;
}
