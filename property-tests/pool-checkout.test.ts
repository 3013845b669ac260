import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { checkout, type CheckedOut } from '../src/postgres/checkout.js';
import { scriptedPool, type ScriptedClient } from '../test/support/scripted-pg.js';
import { checkWithin } from './support/runs.js';

// The pool-connection model (src/postgres/checkout.ts, docs/design.md §13 "Connections"): the real
// pg-pool with scripted clients (test/support/scripted-pg.ts), on vitest's fake clock. Checkouts
// that wait for ever, time out or are aborted; handshakes that take a while, or end with a FATAL in
// the hand-over's own turn (pg parsing ReadyForQuery and a dying server's FATAL in one read); held
// connections whose server goes away; releases that give back or destroy. Whatever the order:
// no 'error' is ever emitted with no listener (an uncaught exception in pg), every checkout settles
// within its bound, a checkout's handler hears its connection's errors while it holds it and never
// after, and once everything is given back the pool holds every live connection idle, with only
// its own listener on it — nothing leaked, nothing piling up.

type Step =
  | {
      readonly op: 'take';
      readonly wait: 'forever' | 'timeout' | 'abort';
      readonly timeoutMs: number;
      /** How a connection made for this checkout's turn handshakes. */
      readonly handshakeMs: number | undefined;
      readonly fatal: boolean;
    }
  | { readonly op: 'release'; readonly pick: number; readonly destroy: boolean }
  | { readonly op: 'serverGone'; readonly pick: number }
  | { readonly op: 'abort' }
  | { readonly op: 'tick'; readonly ms: number };

const step: fc.Arbitrary<Step> = fc.oneof(
  fc.record({
    op: fc.constant('take' as const),
    wait: fc.constantFrom('forever' as const, 'timeout' as const, 'abort' as const),
    timeoutMs: fc.integer({ min: 1, max: 40 }),
    handshakeMs: fc.option(fc.integer({ min: 0, max: 30 }), { nil: undefined }),
    fatal: fc.boolean(),
  }),
  fc.record({ op: fc.constant('release' as const), pick: fc.nat(), destroy: fc.boolean() }),
  fc.record({ op: fc.constant('serverGone' as const), pick: fc.nat() }),
  fc.record({ op: fc.constant('abort' as const) }),
  fc.record({ op: fc.constant('tick' as const), ms: fc.integer({ min: 0, max: 50 }) }),
);

/** One checkout of the run, as the model sees it. */
interface Taken {
  readonly wait: 'forever' | 'timeout' | 'abort';
  /** Its bound on the fake clock, when it has one. */
  readonly deadline: number | undefined;
  state: 'waiting' | 'held' | 'released' | 'rejected';
  settledAt: number | undefined;
  held: CheckedOut | undefined;
  /** Errors its handler heard while it held the connection, and after. */
  heardWhileHeld: number;
  heardAfter: number;
  /** Errors the server sent its connection while it held it. */
  sent: number;
}

afterEach(() => vi.useRealTimers());

describe('pool checkout model', () => {
  it('every order of checkouts, time-outs, aborts, FATALs and releases: no unheard error, nothing leaked', async () => {
    await checkWithin(
      'pool checkout',
      fc.asyncProperty(
        fc.integer({ min: 1, max: 3 }),
        fc.array(step, { minLength: 1, maxLength: 40 }),
        async (max, steps) => {
          vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] });
          const script = scriptedPool(max);
          let aborting = new AbortController();
          const taken: Taken[] = [];
          const holding = (pick: number): Taken | undefined => {
            const held = taken.filter((t) => t.state === 'held');
            return held.length === 0 ? undefined : held[pick % held.length];
          };
          const release = (t: Taken, destroy: boolean): void => {
            t.state = 'released';
            t.held!.release(destroy);
          };
          try {
            for (const s of steps) {
              if (s.op === 'take') {
                script.handshakes.push({ ms: s.handshakeMs, then: s.fatal ? 'fatal' : 'nothing' });
                const t: Taken = {
                  wait: s.wait,
                  deadline: s.wait === 'timeout' ? Date.now() + s.timeoutMs : undefined,
                  state: 'waiting',
                  settledAt: undefined,
                  held: undefined,
                  heardWhileHeld: 0,
                  heardAfter: 0,
                  sent: 0,
                };
                taken.push(t);
                const onError = (): void => {
                  if (t.state === 'held') t.heardWhileHeld++;
                  else t.heardAfter++;
                };
                checkout(script.pool, {
                  onError,
                  ...(s.wait === 'timeout' ? { timeoutMs: s.timeoutMs } : {}),
                  ...(s.wait === 'abort' ? { signal: aborting.signal } : {}),
                }).then(
                  (held) => {
                    t.settledAt = Date.now();
                    t.state = 'held';
                    t.held = held;
                    // A FATAL in the hand-over's turn came before this continuation: the handler
                    // (counted as 'after' then) must have heard it.
                    t.sent = (held.client as unknown as ScriptedClient).emitted;
                    t.heardWhileHeld += t.heardAfter;
                    t.heardAfter = 0;
                  },
                  () => {
                    t.settledAt = Date.now();
                    t.state = 'rejected';
                  },
                );
              } else if (s.op === 'release') {
                const t = holding(s.pick);
                if (t !== undefined) release(t, s.destroy);
              } else if (s.op === 'serverGone') {
                const t = holding(s.pick);
                if (t !== undefined) {
                  t.sent++;
                  (t.held!.client as unknown as ScriptedClient).fail(
                    new Error('server closed the connection'),
                  );
                  // What the library does with a connection that failed: destroy it.
                  release(t, true);
                }
              } else if (s.op === 'abort') {
                aborting.abort(new Error('closing'));
                aborting = new AbortController();
              } else {
                await vi.advanceTimersByTimeAsync(s.ms);
              }
            }
            // Wind down: every wait given up, every connection given back, and time for the pool to
            // finish the handshakes it began for requests given up meanwhile (up to 40 of at most
            // 30 ms each, one after another on a pool of one): at most 5 s of the fake clock.
            aborting.abort(new Error('closing'));
            const busy = (): boolean =>
              taken.some((t) => t.state === 'waiting' || t.state === 'held') ||
              script.pool.waitingCount > 0 ||
              script.pool.idleCount !== script.pool.totalCount;
            for (let round = 0; round < 100 && busy(); round++) {
              for (const t of taken) if (t.state === 'held') release(t, false);
              await vi.advanceTimersByTimeAsync(50);
            }
            await vi.advanceTimersByTimeAsync(50);

            expect(script.uncaught).toEqual([]);
            for (const [i, t] of taken.entries()) {
              // 'forever' waits end when a connection is given back; the wind-down gives them all back.
              expect(t.state, `checkout ${i} (${t.wait}) settled`).not.toBe('waiting');
              if (t.deadline !== undefined) {
                expect(t.settledAt!, `checkout ${i} settled by its time-out`).toBeLessThanOrEqual(t.deadline);
              }
              expect(t.heardAfter, `checkout ${i}: its handler heard nothing after release`).toBe(0);
              expect(t.heardWhileHeld, `checkout ${i}: its handler heard its connection's errors`).toBe(
                t.sent,
              );
            }
            expect(script.pool.waitingCount).toBe(0);
            expect(script.pool.idleCount).toBe(script.pool.totalCount);
            for (const client of script.clients) {
              if (client._ending) continue;
              expect(
                client.listenerCount('error'),
                'an idle connection carries the pool’s listener alone',
              ).toBe(1);
            }
          } finally {
            // pg-pool's end() waits for every connection to come back: not for one that leaked.
            const ending = script.pool.end();
            if (script.pool.idleCount === script.pool.totalCount) await ending;
            vi.useRealTimers();
          }
        },
      ),
      { timeLimitMs: 60_000 },
    );
  });
});
