/**
 * checkout() (src/postgres/checkout.ts) on the real pg-pool, with a scripted Client in place of
 * pg's. The script does what pg does when a new connection's ReadyForQuery and a dying server's
 * FATAL come in one socket read: it finishes the handshake (pg-pool hands the client over) and
 * emits 'error' in the same synchronous turn.
 */
import { EventEmitter } from 'node:events';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { checkout } from '../../src/postgres/checkout.js';

/** What the next connection does after its handshake. */
let afterHandshake: 'fatal' | 'nothing' = 'nothing';
/** How long the next handshakes take (ms); undefined: at once. */
let handshakeMs: number | undefined;
const made: ScriptedClient[] = [];

/** The part of pg.Client that pg-pool uses. */
class ScriptedClient extends EventEmitter {
  _queryable = true;
  _ending = false;
  released: Array<boolean | Error | undefined> = [];
  constructor() {
    super();
    made.push(this);
  }
  connect(callback: (err?: Error) => void): void {
    const fatal = afterHandshake === 'fatal';
    const finish = (): void => {
      callback();
      if (fatal) {
        this._queryable = false;
        this.emit('error', new Error('terminating connection due to unexpected postmaster exit'));
      }
    };
    if (handshakeMs === undefined) finish();
    else setTimeout(finish, handshakeMs);
  }
  end(callback?: () => void): void {
    this._ending = true;
    this.emit('end');
    callback?.();
  }
  ref(): void {}
  unref(): void {}
}

function scriptedPool(max = 1): pg.Pool {
  made.length = 0;
  afterHandshake = 'nothing';
  handshakeMs = undefined;
  const pool = new pg.Pool({ Client: ScriptedClient as never, max });
  pool.on('error', () => undefined);
  return pool;
}

/** Runs `fn` and returns what it threw synchronously (an 'error' emitted with no listener throws). */
function thrownBy(fn: () => void): unknown {
  try {
    fn();
    return undefined;
  } catch (err) {
    return err;
  }
}

describe('checkout', () => {
  it('hears a FATAL that pg emits in the same turn as the hand-over (the promise form does not)', async () => {
    const pool = scriptedPool();
    afterHandshake = 'fatal';
    const heard: string[] = [];
    let thrown: unknown;
    const held = await new Promise<Awaited<ReturnType<typeof checkout>>>((resolve, reject) => {
      thrown = thrownBy(() => {
        checkout(pool, { onError: (err) => heard.push(err.message) }).then(resolve, reject);
      });
    });
    expect(thrown).toBeUndefined();
    expect(heard).toEqual(['terminating connection due to unexpected postmaster exit']);
    held.release(true);

    // The same script through `await pool.connect()`: the emit finds no listener and throws from
    // inside pg's handshake callback (in pg, the socket's data handler: an uncaught exception).
    const bare = scriptedPool();
    afterHandshake = 'fatal';
    const raw = thrownBy(() => void bare.connect());
    expect(String(raw)).toContain('unexpected postmaster exit');
    await pool.end();
  });

  it('takes its listener off at release: a connection handed out 50 times carries only the pool’s', async () => {
    const pool = scriptedPool();
    const heard: string[] = [];
    for (let i = 0; i < 50; i++) {
      const held = await checkout(pool, { onError: (err) => heard.push(err.message) });
      expect(held.client.listenerCount('error')).toBe(1);
      held.release();
      held.release(); // a second call does nothing (pg-pool would throw)
    }
    expect(made.length).toBe(1);
    // Idle in the pool: pg-pool's idle listener alone, and an error reaches the pool, not us.
    expect(made[0]!.listenerCount('error')).toBe(1);
    made[0]!.emit('error', new Error('idle connection lost'));
    expect(heard).toEqual([]);
    await pool.end();
  });

  it('a destroyed connection is closed, not handed out again', async () => {
    const pool = scriptedPool();
    const first = await checkout(pool);
    first.release(new Error('broken'));
    const second = await checkout(pool);
    expect(second.client).not.toBe(first.client);
    expect(made.length).toBe(2);
    expect(made[0]!._ending).toBe(true);
    second.release();
    await pool.end();
  });

  it('gives up after timeoutMs when every connection is held; the late one goes back to the pool', async () => {
    const pool = scriptedPool(1);
    const holder = await checkout(pool);
    const started = performance.now();
    const waiting = checkout(pool, { timeoutMs: 100 });
    await expect(waiting).rejects.toThrow('no connection from the pool within 100 ms');
    const waited = performance.now() - started;
    expect(waited).toBeGreaterThanOrEqual(95);
    expect(waited).toBeLessThan(1_000);
    // The holder lets go: the pool hands it to the timed-out wait, which gives it straight back.
    holder.release();
    const again = await checkout(pool, { timeoutMs: 1_000 });
    expect(again.client).toBe(holder.client);
    expect(again.client.listenerCount('error')).toBe(1);
    expect(pool.totalCount).toBe(1);
    again.release();
    await pool.end();
  });

  it('ends the wait when the signal aborts, with its reason; a connection that comes after goes back', async () => {
    const pool = scriptedPool(1);
    handshakeMs = 50;
    const closing = new AbortController();
    const waiting = checkout(pool, { signal: closing.signal });
    closing.abort(new Error('closing'));
    await expect(waiting).rejects.toThrow('closing');
    // An aborted signal refuses before asking the pool.
    await expect(checkout(pool, { signal: closing.signal })).rejects.toThrow('closing');
    const next = await checkout(pool, { timeoutMs: 1_000 });
    expect(made.length).toBe(1);
    expect(next.client).toBe(made[0]);
    next.release();
    await pool.end();
  });

  it("rejects with the pool's error", async () => {
    const pool = scriptedPool();
    await pool.end();
    await expect(checkout(pool)).rejects.toThrow(/pool after calling end/);
  });

  it('works with a stand-in pool that has only the promise form, and answers once', async () => {
    const client = Object.assign(new EventEmitter(), { released: 0, release: () => client.released++ });
    // Calls the callback and resolves too: the first answer counts.
    const pool = {
      connect: (callback?: (err: Error | undefined, c: unknown) => void) => {
        callback?.(undefined, client);
        return Promise.resolve(client);
      },
    };
    const held = await checkout(pool as never);
    expect(held.client).toBe(client);
    expect(client.listenerCount('error')).toBe(1);
    held.release();
    expect(client.released).toBe(1);
    expect(client.listenerCount('error')).toBe(0);

    const promiseOnly = { connect: () => Promise.resolve(client) };
    const viaPromise = await checkout(promiseOnly as never);
    expect(viaPromise.client).toBe(client);
    viaPromise.release();
    const refusing = { connect: () => Promise.reject(new Error('refused')) };
    await expect(checkout(refusing as never)).rejects.toThrow('refused');
  });
});
