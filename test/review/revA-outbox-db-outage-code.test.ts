/**
 * revA (hostile review), outbox relay, permanent vs transient (REVIEW.md §5): PostgreSQL
 * unreachable for longer than reconnect.giveUpAfterMs stops the relay with
 * DEDUP_BROKER_UNREACHABLE ("gave up after … ms of failures") although the broker was reachable
 * throughout: the code sends the operator to the wrong server (the database's error is only the
 * cause). Expected: a code about the store (e.g. DEDUP_STORE_REFUSED, as the consumer's
 * reconnectTimeoutMs gives), or a message naming PostgreSQL.
 *
 * Needs the broker and the project's PostgreSQL.
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { PgOutboxRelay } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { FaultProxy } from '../support/proxy.js';
import { useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe('revA: outbox relay, PostgreSQL down past giveUpAfterMs', () => {
  it('stops with an error that names the database, not the broker', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const stream = uniqueName('reva-dbdown');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => void (await client().deleteStream({ stream })));
    const target = new URL(PG_URL);
    const proxy = await FaultProxy.start(target.hostname, Number(target.port));
    cleanups.push(async () => proxy.close());
    const via = new URL(PG_URL);
    via.port = String(proxy.port);
    const pool = new pg.Pool({ connectionString: via.toString(), max: 4, connectionTimeoutMillis: 500 });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end().catch(() => undefined));
    const relay = await PgOutboxRelay.open({
      pool,
      schema: db.schema,
      producerName: uniqueName('reva-relay'),
      stream,
      connection: STREAM_CONNECTION,
      connectTimeoutMs: 500,
      pollIntervalMs: 100,
      reconnect: { initialDelayMs: 50, maxDelayMs: 200, giveUpAfterMs: 1_500 },
    });
    cleanups.push(() => relay.close());
    expect(relay.stats.isActive).toBe(true);
    proxy.refuse(true);
    proxy.cut();
    const error = (await Promise.race([relay.closed(), new Promise((r) => setTimeout(() => r('still running'), 15_000))])) as
      | (Error & { code?: string })
      | string;
    const seen = typeof error === 'string' ? error : `${error.code}: ${error.message}`;
    expect(seen).not.toMatch(/BROKER/);
    expect(seen).toMatch(/STORE|PostgreSQL|database/i);
  }, 60_000);
});
