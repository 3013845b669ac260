/**
 * revA (hostile review): a handler slower than idleInTransactionTimeoutMs between its statements
 * (its own non-SQL work counts as idle, store.ts's TSDoc says so). The server ends the session
 * (25P03), but the FATAL arrives on the client's 'error' event, which the store ignores; the
 * handler's next query fails "Client has encountered a connection error and is not queryable",
 * classified as a LOST CONNECTION: the handler is re-run (reconnect backoff) for reconnectTimeoutMs
 * (60 s by default), then the consumer stops with DEDUP_STORE_REFUSED "could not reach the
 * database" — the database was reachable all along; the cause (the handler held the transaction
 * idle) is never named. (The new 25P03-as-fence rule does not see this case at all.)
 *
 * Needs the project's PostgreSQL.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { VerifyingConsumerCore, type IncomingMessage } from '../../src/consumer/core.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('revA: a handler slower than idleInTransactionTimeoutMs', () => {
  it('stops with a typed error (or backs off), instead of being re-run at once for ever', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const store = await PostgresStore.open({
      pool: db.pool,
      schema: db.schema,
      idleInTransactionTimeoutMs: 300,
      lockTimeoutMs: 1_000,
      queryTimeoutMs: 2_000,
      reconnectTimeoutMs: 2_000,
    });
    cleanups.push(() => store.close());
    let slow = true;
    let runs = 0;
    const core = await VerifyingConsumerCore.open({
      consumerName: 'slow',
      store,
      commitEvery: 1,
      handler: postgresHandler(async (_m, { client }) => {
        runs++;
        await client.query('SELECT 1');
        if (slow) await sleep(700); // an external call, slower than the idle limit
        await client.query('SELECT 2');
      }),
    });
    cleanups.push(() => core.close());
    const messages: IncomingMessage[] = [
      { offset: 0n, content: Buffer.from('x'), applicationProperties: identityHeaders('p', 1n) },
    ];
    let rewound: number | undefined;
    core.onRewind((delayMs) => {
      core.discardPending();
      rewound = delayMs;
    });
    let stopped: unknown;
    const reading = (async () => {
      try {
        let next = Number(core.resumeOffset ?? 0n);
        while (next < messages.length) {
          await core.process(messages[next]!);
          if (rewound === undefined) next++;
          else {
            await sleep(rewound);
            rewound = undefined;
            next = Number(core.resumeOffset ?? 0n);
          }
        }
        await core.flush();
      } catch (err) {
        stopped = err;
      }
    })();
    await sleep(6_000);
    const seen = { runs, stats: { ...core.stats }, stopped: stopped === undefined ? undefined : String((stopped as Error).message) };
    slow = false; // let the test end
    await reading;
    // Expected: the consumer stopped with a typed error after a bounded number of re-runs.
    console.log(JSON.stringify(seen));
    // Expected: stopped, with an error that names the cause (the handler held the transaction idle
    // past idleInTransactionTimeoutMs), not "could not reach the database".
    expect(seen.stopped).toBeDefined();
    expect(seen.stopped).not.toMatch(/could not reach the database/);
    expect(seen.stopped).toMatch(/idle/i);
  }, 30_000);
});
