/**
 * The PostgreSQL server SIGKILLed in the middle of a batch and started again (issue 34, faults):
 * the verifying consumer waits, reconnects and goes on, nothing lost or doubled. This file kills
 * the SHARED test server (`bash scripts/postgres.sh kill`, then `up`): it is the only test that
 * does, and it restarts the server before it ends.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { PG_URL, useSchema } from '../support/postgres.js';

const run = promisify(execFile);
const postgres = (command: 'kill' | 'up'): Promise<unknown> =>
  run('bash', ['scripts/postgres.sh', command], { timeout: 60_000 });

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe('verifying consumer on PostgreSQL: server restart', () => {
  it('postgres - the server SIGKILLed mid-batch and started again: the consumer reconnects and goes on, exact fold', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const { pool, schema } = db;
    await pool.query(`CREATE TABLE "${schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`);
    const store = await PostgresStore.open({ connectionString: PG_URL, schema });
    cleanups.push(() => store.close());
    let killedAt: number | undefined;
    let restarting: Promise<unknown> | undefined;
    const core = await VerifyingConsumerCore.open({
      consumerName: 'ledger',
      store,
      commitEvery: 4,
      handler: postgresHandler(async (message, { client }) => {
        if (message.offset === 10n && killedAt === undefined) {
          // Offsets 8 and 9 are in the open batch, 10 is being applied.
          await postgres('kill');
          killedAt = Date.now();
          restarting = postgres('up');
        }
        const amount = Number(message.body.toString());
        await client.query(
          `INSERT INTO "${schema}".balances (account, amount) VALUES ('x', $1)
           ON CONFLICT (account) DO UPDATE SET amount = balances.amount + excluded.amount`,
          [amount],
        );
      }),
    });
    let rewound: number | undefined;
    core.onRewind((delayMs) => {
      core.discardPending();
      rewound = delayMs;
    });
    // 30 messages, IDs 1..30 with 5 copies planted: the fold is 1 + … + 30.
    const stream: IncomingMessage[] = [];
    for (let id = 1; id <= 30; id++) {
      stream.push({
        offset: BigInt(stream.length),
        content: Buffer.from(String(id)),
        applicationProperties: identityHeaders('a', BigInt(id)),
      });
      if (id % 6 === 0) stream.push({ ...stream[stream.length - 3]!, offset: BigInt(stream.length) });
    }
    let next = 0;
    try {
      while (next < stream.length) {
        await core.process(stream[next]!);
        if (rewound === undefined) next++;
        else {
          await new Promise((resolve) => setTimeout(resolve, rewound));
          rewound = undefined;
          next = Number(core.resumeOffset ?? 0n);
        }
      }
      await core.flush();
    } finally {
      await restarting;
    }
    const back = Date.now() - killedAt!;
    await core.close();
    expect(core.failure).toBeUndefined();
    expect(core.stats.reconnects).toBeGreaterThan(0);
    const { rows } = await pool.query<{ amount: string }>(`SELECT amount FROM "${schema}".balances`);
    expect(rows.map((r) => Number(r.amount))).toEqual([(30 * 31) / 2]);
    const offset = await pool.query<{ committed_offset: string }>(
      `SELECT committed_offset FROM "${schema}".consumer_offsets WHERE consumer = 'ledger'`,
    );
    expect(offset.rows[0]?.committed_offset).toBe(String(stream.length - 1));
    console.log(
      `[postgres restart] ${core.stats.reconnects} reconnect attempts, finished ${back} ms after the kill`,
    );
  }, 120_000);
});
