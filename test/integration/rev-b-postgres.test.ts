/**
 * Hostile review B (issue 34): failing tests against the real PostgreSQL server of
 * `scripts/postgres.sh` (no broker: the core is fed messages directly, as postgres-store.test.ts does).
 */
import { afterEach, describe, expect, it } from 'vitest';
import pg from 'pg';
import { VerifyingConsumerCore, type VerifyingConsumerOptions } from '../../src/consumer/core.js';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler, type PostgresMessageHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const credit = (offset: number, producer: string, id: number, amount: number): IncomingMessage => ({
  offset: BigInt(offset),
  content: Buffer.from(JSON.stringify({ account: 'x', amount })),
  applicationProperties: identityHeaders(producer, BigInt(id)),
});

const add = (schema: string, amount: number): [string, unknown[]] => [
  `INSERT INTO "${schema}".balances (account, amount) VALUES ('x', $1)
   ON CONFLICT (account) DO UPDATE SET amount = balances.amount + excluded.amount`,
  [amount],
];

function openCore(
  store: PostgresStore,
  handler: PostgresMessageHandler,
  options: Partial<VerifyingConsumerOptions> = {},
): Promise<VerifyingConsumerCore> {
  return VerifyingConsumerCore.open({
    consumerName: 'ledger',
    store,
    handler: postgresHandler(handler),
    commitEvery: 3,
    ...options,
  });
}

describe('rev-b: PostgreSQL store', () => {
  it('rev-b - close() returns when the batch waits for a connection of an exhausted user pool (no connectionTimeoutMillis)', async () => {
    const base = await useSchema();
    cleanups.push(base.drop);
    const { PG_URL } = await import('../support/postgres.js');
    const pool = new pg.Pool({ connectionString: PG_URL, max: 1 });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end().catch(() => undefined));
    await pool.query(
      `CREATE TABLE "${base.schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`,
    );
    const store = await PostgresStore.open({
      pool,
      schema: base.schema,
      queryTimeoutMs: 500,
      lockTimeoutMs: 400,
      idleInTransactionTimeoutMs: 300,
    });
    cleanups.push(() => store.close());
    const core = await openCore(store, async (message, { client }) => {
      const { amount } = JSON.parse(message.body.toString()) as { amount: number };
      await client.query(...add(base.schema, amount));
    });
    // The application holds the pool's one connection (a long report, a leaked client).
    const held = await pool.connect();
    cleanups.unshift(() => Promise.resolve(held.release()));
    const processing = Promise.resolve(core.process(credit(0, 'a', 1, 1))).catch((e: unknown) => e);
    const closed = core.close().then(() => 'closed');
    const outcome = await Promise.race([
      closed,
      new Promise((resolve) => setTimeout(() => resolve('still waiting after 5 s'), 5_000)),
    ]);
    held.release();
    cleanups.shift();
    await processing;
    expect(outcome).toBe('closed');
  });
});
