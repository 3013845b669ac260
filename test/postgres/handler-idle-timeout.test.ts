/**
 * A handler slower than idleInTransactionTimeoutMs between its statements (its own work counts as
 * idle). The server ends the session (SQLSTATE 25P03), but the FATAL arrives on the client's
 * 'error' event, and the handler's next query fails "not queryable", which read as a lost
 * connection: the handler was re-run for reconnectTimeoutMs (60 s by default) and the consumer
 * then stopped with "could not reach the database", the cause never named (hostile review A,
 * finding 5). Now the 25P03 on the 'error' event is a fence (a paused process goes on from the
 * stored offset), and the same batch ended so three times in a row stops the consumer with
 * DEDUP_STORE_REFUSED naming idle_in_transaction_session_timeout.
 *
 * Needs the project's PostgreSQL (fails loudly without it); about 3 s.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { DedupError } from '../../src/errors.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('a handler slower than idleInTransactionTimeoutMs', () => {
  it('is re-run as after a fence, and stops after three idle endings with an error naming the cause', async () => {
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
    let runs = 0;
    const core = await VerifyingConsumerCore.open({
      consumerName: 'slow',
      store,
      commitEvery: 1,
      handler: postgresHandler(async (_m, { client }) => {
        runs++;
        await client.query('SELECT 1');
        await sleep(700); // an external call, slower than the idle limit
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
    await reading;
    expect(stopped).toBeInstanceOf(DedupError);
    const error = stopped as DedupError;
    expect({ code: error.code, runs, fences: core.stats.fences, commits: core.stats.commits }).toEqual({
      code: 'DEDUP_STORE_REFUSED',
      runs: 3,
      fences: 2,
      commits: 0,
    });
    expect(error.message).toMatch(/idle_in_transaction_session_timeout/);
    expect(error.message).toMatch(/idleInTransactionTimeoutMs/);
    expect(error.message).not.toMatch(/could not reach the database/);
  }, 30_000);
});
