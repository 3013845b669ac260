/**
 * checkout() (src/postgres/checkout.ts) on the real pg-pool, with a scripted Client in place of
 * pg's (test/support/scripted-pg.ts): it can do what pg does when a new connection's ReadyForQuery
 * and a dying server's FATAL come in one socket read — finish the handshake (pg-pool hands the
 * client over) and emit 'error' in the same synchronous turn.
 */
import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { checkout } from '../../src/postgres/checkout.js';
import { scriptedPool } from '../support/scripted-pg.js';

/** Runs `fn` and returns what it threw synchronously. */
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
    const script = scriptedPool();
    script.fallback = { then: 'fatal' };
    const heard: string[] = [];
    const held = await checkout(script.pool, { onError: (err) => heard.push(err.message) });
    expect(script.uncaught).toEqual([]);
    expect(heard).toEqual(['terminating connection due to unexpected postmaster exit']);
    held.release(true);
    await script.pool.end();

    // The same script through `await pool.connect()`: the emit finds no listener and throws from
    // inside pg's handshake callback (in pg, the socket's data handler: an uncaught exception).
    const bare = scriptedPool();
    bare.fallback = { then: 'fatal' };
    const client = await bare.pool.connect();
    expect(bare.uncaught.map(String)).toEqual([
      'Error: terminating connection due to unexpected postmaster exit',
    ]);
    client.release(true);
    await bare.pool.end();
  });

  it('takes its listener off at release: a connection handed out 50 times carries only the pool’s', async () => {
    const { pool, clients } = scriptedPool();
    const heard: string[] = [];
    for (let i = 0; i < 50; i++) {
      const held = await checkout(pool, { onError: (err) => heard.push(err.message) });
      expect(held.client.listenerCount('error')).toBe(1);
      held.release();
      held.release(); // a second call does nothing (pg-pool would throw)
    }
    expect(clients.length).toBe(1);
    // Idle in the pool: pg-pool's idle listener alone, and an error reaches the pool, not us.
    expect(clients[0]!.listenerCount('error')).toBe(1);
    clients[0]!.fail(new Error('idle connection lost'));
    expect(heard).toEqual([]);
    await pool.end();
  });

  it('a destroyed connection is closed, not handed out again', async () => {
    const { pool, clients } = scriptedPool();
    const first = await checkout(pool);
    first.release(new Error('broken'));
    const second = await checkout(pool);
    expect(second.client).not.toBe(first.client);
    expect(clients.length).toBe(2);
    expect(clients[0]!._ending).toBe(true);
    second.release();
    await pool.end();
  });

  it('gives up after timeoutMs when every connection is held; the late one goes back to the pool', async () => {
    const { pool } = scriptedPool(1);
    const holder = await checkout(pool);
    const started = performance.now();
    const waiting = checkout(pool, { timeoutMs: 100, timeoutName: 'queryTimeoutMs' });
    await expect(waiting).rejects.toThrow('no connection from the pool within queryTimeoutMs (100 ms)');
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

  it('5 000 abandoned waits on an exhausted pool: the late hand-overs neither overflow the stack nor keep the connection', async () => {
    // A pool without connectionTimeoutMillis keeps an abandoned request queued; pg-pool hands a
    // released connection to the next one inside release(). Given back in that same stack, about
    // 2 000 of them overflowed it (RangeError out of the holder's release()), and the connection
    // stayed checked out with no listener.
    const { pool, clients } = scriptedPool(1);
    const holder = await checkout(pool);
    const closing = new AbortController();
    const abandoned = Array.from({ length: 5_000 }, () =>
      checkout(pool, { signal: closing.signal }).then(
        () => 'got one',
        () => 'gave up',
      ),
    );
    closing.abort(new Error('gave up'));
    expect(new Set(await Promise.all(abandoned))).toEqual(new Set(['gave up']));
    expect(thrownBy(() => holder.release())).toBeUndefined();
    // The connection passes through every abandoned request, then serves a live one.
    const next = await checkout(pool, { timeoutMs: 5_000 });
    expect(next.client).toBe(holder.client);
    expect(next.client.listenerCount('error')).toBe(1);
    expect(pool.waitingCount).toBe(0);
    next.release();
    expect(clients.length).toBe(1);
    await pool.end();
  });

  it('ends the wait when the signal aborts, with its reason; a connection that comes after goes back', async () => {
    const script = scriptedPool(1);
    script.fallback = { ms: 50 };
    const closing = new AbortController();
    const waiting = checkout(script.pool, { signal: closing.signal });
    closing.abort(new Error('closing'));
    await expect(waiting).rejects.toThrow('closing');
    // An aborted signal refuses before asking the pool.
    await expect(checkout(script.pool, { signal: closing.signal })).rejects.toThrow('closing');
    const next = await checkout(script.pool, { timeoutMs: 1_000 });
    expect(script.clients.length).toBe(1);
    expect(next.client).toBe(script.clients[0]);
    next.release();
    await script.pool.end();
  });

  it("rejects with the pool's error", async () => {
    const { pool } = scriptedPool();
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
