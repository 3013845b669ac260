/**
 * Review B, L4 (issue 34 item 4): a batch dropped while its handler runs — a consumer group's
 * partition revoked mid-handler (GroupPartition #lose calls `discardPending()`) — on the real
 * PostgreSQL server. The handler's later queries are refused as rolled back (`DEDUP_ABORTED`), not
 * as a misuse that stops the consumer; nothing of the batch commits; the message is processed
 * again afterwards. The core is fed directly: the group's part is consumer-group-postgres's.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import type { IncomingMessage } from '../../src/consumer/types.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const message = (offset: number, id: number): IncomingMessage => ({
  offset: BigInt(offset),
  content: Buffer.from('5'),
  applicationProperties: identityHeaders('p', BigInt(id)),
});

describe('PostgreSQL store - a batch discarded while its handler runs (review B L4)', () => {
  it('rolls the batch back cleanly: the handler’s next query is refused as rolled back, the consumer goes on, nothing commits, the message is applied once later', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    await db.pool.query(`CREATE TABLE "${db.schema}".rows (id int PRIMARY KEY, at bigint NOT NULL)`);
    const store = await PostgresStore.open({ pool: db.pool, schema: db.schema });
    cleanups.push(() => store.close());
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const seen: unknown[] = [];
    let calls = 0;
    const core = await VerifyingConsumerCore.open({
      consumerName: 'revoked',
      store,
      commitEvery: 10,
      handler: postgresHandler(async (_message, { client }) => {
        calls++;
        await client.query(`INSERT INTO "${db.schema}".rows (id, at) VALUES (1, $1)`, [Date.now()]);
        if (calls === 1) await gate;
        try {
          await client.query(`INSERT INTO "${db.schema}".rows (id, at) VALUES (2, $1)`, [Date.now()]);
        } catch (err) {
          seen.push(err);
          throw err;
        }
      }),
    });
    cleanups.push(() => core.close());
    const first = core.process(message(0, 1));
    // The handler is inside its batch, between its two queries: the partition is revoked.
    await new Promise<void>((resolve) => {
      const poll = (): void => {
        if (calls === 1) resolve();
        else setImmediate(poll);
      };
      poll();
    });
    core.discardPending();
    release();
    await first;
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ code: 'DEDUP_ABORTED' });
    expect(core.failure).toBeUndefined();
    await core.flush();
    expect(core.committedOffset).toBeUndefined();
    const { rows: none } = await db.pool.query(`SELECT id FROM "${db.schema}".rows`);
    expect(none).toEqual([]);
    // Delivered again (the next holder, here the same core): applied once, committed.
    await core.process(message(0, 1));
    await core.flush();
    expect(core.committedOffset).toBe(0n);
    const { rows } = await db.pool.query<{ id: number }>(`SELECT id FROM "${db.schema}".rows ORDER BY id`);
    expect(rows.map((r) => r.id)).toEqual([1, 2]);
    const { rows: offsets } = await db.pool.query<{ committed_offset: string }>(
      `SELECT committed_offset FROM "${db.schema}".consumer_offsets WHERE consumer = 'revoked'`,
    );
    expect(offsets).toEqual([{ committed_offset: '0' }]);
  });
});
