/**
 * `stream-dedup outbox status` against the real PostgreSQL and broker (issue 35): rows waiting and
 * the oldest one's age, the relay holding the lock (and none once it closed), the last published ID;
 * a refused server and an unknown producer exit 4.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { PgOutbox, PgOutboxRelay } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { runCli } from '../support/cli.js';
import { connectPool, PG_URL, useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

interface StatusJson {
  producers: Array<{
    producerName: string;
    waiting: number;
    oldestAgeMs?: number;
    relay?: { holdsLock: boolean; epoch: string; holder: string };
    targets: Array<{ target: string; lastAssigned: string; lastConfirmed: string }>;
  }>;
}

describe('stream-dedup outbox status', () => {
  it('reports rows waiting, their age, the relay holding the lock and the last published id', async () => {
    const { pool, schema, drop } = await useSchema();
    cleanups.push(drop);
    const stream = uniqueName('cli-outbox');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(
      async () =>
        void (await client()
          .deleteStream({ stream })
          .catch(() => undefined)),
    );
    const outbox = PgOutbox.create({ schema, producerName: 'orders-svc' });
    const enqueue = async (n: number): Promise<void> => {
      const sql = await pool.connect();
      try {
        await sql.query('BEGIN');
        for (let i = 0; i < n; i++) await outbox.enqueue(sql, Buffer.from(`order ${i}`));
        await sql.query('COMMIT');
      } finally {
        sql.release();
      }
    };
    const status = async (...extra: string[]) => {
      const run = await runCli(['outbox', 'status', '--postgres', PG_URL, '--schema', schema, ...extra]);
      expect(run.code, run.stderr).toBe(0);
      return run.stdout;
    };
    await enqueue(3);
    const waiting = JSON.parse(await status('--json')) as StatusJson;
    expect(waiting.producers).toHaveLength(1);
    expect(waiting.producers[0]).toMatchObject({ producerName: 'orders-svc', waiting: 3, targets: [] });
    expect(waiting.producers[0]!.oldestAgeMs).toBeGreaterThanOrEqual(0);
    expect(waiting.producers[0]!.relay).toBeUndefined();

    const relayPool = await connectPool();
    cleanups.push(() => relayPool.end());
    let confirmed = 0;
    let three: () => void = () => undefined;
    const allThree = new Promise<void>((resolve) => (three = resolve));
    const relay = await PgOutboxRelay.open({
      pool: relayPool,
      schema,
      producerName: 'orders-svc',
      stream,
      connection: STREAM_CONNECTION,
      onEvent: (e) => {
        if (e.type === 'confirmed' && (confirmed += e.count) >= 3) three();
      },
    });
    cleanups.push(() => relay.close());
    await allThree;
    const active = await status();
    expect(active).toContain('producer orders-svc');
    expect(active).toContain('rows waiting:   0');
    expect(active).toMatch(/relay: +\S+ holds the lock \(epoch 1, since /);
    expect(active).toContain(`last published: ${stream} 3`);
    await relay.close();
    const closed = await status('--producer', 'orders-svc');
    expect(closed).toMatch(/none holds the lock \(the last, \S+, epoch 1/);

    const unknown = await runCli([
      'outbox',
      'status',
      '--postgres',
      PG_URL,
      '--schema',
      schema,
      '--producer',
      'nobody',
    ]);
    expect(unknown.code).toBe(4);
    expect(unknown.stderr).toContain('has no outbox row, relay or ID of producer nobody');
    const refused = await runCli([
      'outbox',
      'status',
      '--postgres',
      PG_URL.replace(/:[^:@/]*@/, ':wrong@'),
      '--schema',
      schema,
    ]);
    expect(refused.code).toBe(4);
    expect(refused.stderr).toContain('DEDUP_STORE_REFUSED');
    expect(refused.stderr).toContain('password');
  }, 120_000);
});
