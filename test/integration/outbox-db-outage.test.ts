/**
 * The outbox relay through a PostgreSQL outage (review A, REVIEW.md §5), real broker, real
 * PostgreSQL behind a fault proxy: an outage shorter than `reconnect.giveUpAfterMs` is retried and
 * the relay goes on (a row committed meanwhile is published once); one longer stops the relay
 * within the bound with `DEDUP_STORE_REFUSED` naming PostgreSQL — not `DEDUP_BROKER_UNREACHABLE`,
 * which sent the operator to the broker that was reachable all along.
 */
import pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { PgOutbox, PgOutboxRelay } from '../../src/postgres.js';
import type { OutboxRelayEvent } from '../../src/postgres/outbox/relay-options.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { FaultProxy } from '../support/proxy.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('outbox relay, PostgreSQL unreachable', () => {
  it('retries an outage within giveUpAfterMs, and stops with DEDUP_STORE_REFUSED after one past it', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    const stream = uniqueName('outbox-dbdown');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(async () => void (await client().deleteStream({ stream })));
    const target = new URL(PG_URL);
    const proxy = await FaultProxy.start(target.hostname, Number(target.port));
    cleanups.push(() => proxy.close());
    const via = new URL(PG_URL);
    via.port = String(proxy.port);
    const pool = new pg.Pool({ connectionString: via.toString(), max: 4, connectionTimeoutMillis: 500 });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end().catch(() => undefined));
    const producerName = uniqueName('relay-dbdown');
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    const events: OutboxRelayEvent[] = [];
    const relay = await PgOutboxRelay.open({
      pool,
      schema: db.schema,
      producerName,
      stream,
      connection: STREAM_CONNECTION,
      connectTimeoutMs: 500,
      pollIntervalMs: 100,
      takeoverIntervalMs: 100,
      reconnect: { initialDelayMs: 50, maxDelayMs: 200, giveUpAfterMs: 1_500 },
      onEvent: (e) => events.push(e),
    });
    cleanups.push(() => relay.close());
    expect(relay.stats.isActive).toBe(true);
    const confirmedUpTo = async (n: number): Promise<void> => {
      while (relay.stats.confirmed < n) await sleep(20);
    };

    // 1. An outage of 600 ms: retried, then the relay goes on.
    await outbox.enqueue(db.pool, Buffer.from('before'));
    await confirmedUpTo(1);
    proxy.refuse(true);
    proxy.cut();
    await outbox.enqueue(db.pool, Buffer.from('during')); // straight to the server
    await sleep(600);
    proxy.refuse(false);
    await confirmedUpTo(2);
    expect(events.some((e) => e.type === 'retrying')).toBe(true);
    expect(events.filter((e) => e.type === 'stopped')).toEqual([]);

    // 2. An outage past giveUpAfterMs: the relay stops, naming the database.
    const downAt = performance.now();
    proxy.refuse(true);
    proxy.cut();
    const error = await Promise.race([relay.closed(), sleep(15_000).then(() => 'still running' as const)]);
    const stoppedAfter = performance.now() - downAt;
    console.log(
      `[outbox db outage] stopped ${stoppedAfter.toFixed(0)} ms after the database went (giveUpAfterMs 1500)`,
    );
    expect(error).toBeInstanceOf(DedupError);
    expect((error as DedupError).code).toBe('DEDUP_STORE_REFUSED');
    expect((error as DedupError).message).toMatch(/PostgreSQL/);
    // giveUpAfterMs + one connect attempt (connectTimeoutMs) + one backoff step, with slack for a loaded machine.
    expect(stoppedAfter).toBeLessThan(1_500 + 500 + 200 + 1_500);
    const messages = await readAll(client(), stream);
    expect(messages.map((m) => m.content.toString())).toEqual(['before', 'during']);
  }, 60_000);
});
