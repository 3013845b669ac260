/**
 * The outbox relay with PostgreSQL SIGKILLed and started again under it (issue 35), while the
 * application commits from 8 concurrent transactions. The server is a PRIVATE one
 * (test/support/private-postgres.ts: its own folder and port, started by scripts/postgres.sh):
 * the shared server on 5433 is never touched. After the restart the relay reconnects, recovers what
 * it had numbered, and the stream holds every committed row once, none rolled back, keys in order.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { formatReport } from '../../src/history/checker.js';
import { migrate } from '../../src/postgres/schema.js';
import { PgOutbox, PgOutboxRelay, type OutboxRelayEvent } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import {
  checkOutbox,
  createTruthTable,
  readTruth,
  runApplication,
  type Enqueue,
} from '../support/outbox-app.js';
import { waitForEmptyOutbox } from '../support/outbox-relay.js';
import { connectPool, uniqueSchema } from '../support/postgres.js';
import { startPrivatePostgres } from '../support/private-postgres.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe('outbox relay - PostgreSQL restart', () => {
  it('the server SIGKILLed mid-run and started again: the relay reconnects, every committed row once', async () => {
    const started = performance.now();
    const server = await startPrivatePostgres();
    cleanups.push(() => server.remove());
    const pool = await connectPool(server.url);
    cleanups.push(() => pool.end());
    const schema = uniqueSchema('sd_outbox');
    await migrate(pool, { schema });
    await createTruthTable(pool, schema);
    const stream = uniqueName('outbox-pg-restart');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(
      async () =>
        void (await client()
          .deleteStream({ stream })
          .catch(() => undefined)),
    );
    const producerName = 'outbox-pg-restart';
    const outbox = PgOutbox.create({ schema, producerName });
    const enqueue: Enqueue = (c, body, options) => outbox.enqueue(c, body, options);

    const events: OutboxRelayEvent[] = [];
    const relayPool = await connectPool(server.url);
    cleanups.push(() => relayPool.end());
    const relay = await PgOutboxRelay.open({
      pool: relayPool,
      schema,
      producerName,
      stream,
      connection: STREAM_CONNECTION,
      pollIntervalMs: 200,
      queryTimeoutMs: 5_000,
      reconnect: { initialDelayMs: 100, maxDelayMs: 500 },
      onEvent: (e) => events.push(e),
    });
    cleanups.push(() => relay.close());
    const stop = new AbortController();
    const app = runApplication({ pool, schema, enqueue, transactionsPerWorker: 10_000, signal: stop.signal });
    const confirmedBefore = (): number => events.filter((e) => e.type === 'confirmed').length;
    while (confirmedBefore() < 3) await new Promise((resolve) => setTimeout(resolve, 20));
    const killedAt = performance.now();
    await server.kill();
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    await server.start();
    const upAt = performance.now();
    const before = events.length;
    while (!events.slice(before).some((e) => e.type === 'confirmed'))
      await new Promise((resolve) => setTimeout(resolve, 20));
    const resumedAt = performance.now();
    await new Promise((resolve) => setTimeout(resolve, 500));
    stop.abort();
    const result = await app;
    await waitForEmptyOutbox(pool, schema, producerName);
    await relay.close();
    expect(relay.stats.isActive).toBe(false);

    const truth = await readTruth(pool, schema);
    const messages = await readAll(client(), stream);
    const report = checkOutbox(
      truth,
      result.rolledBack,
      messages.map((m) => m.content),
    );
    const retrying = events.filter((e) => e.type === 'retrying').length;
    console.log(
      `[outbox pg restart] down ${(upAt - killedAt).toFixed(0)} ms, first confirm ${(resumedAt - upAt).toFixed(0)} ms after the restart, ` +
        `retrying events=${retrying}, commits of unknown outcome=${result.unknown}, rows=${truth.length} stream=${messages.length} ` +
        `${formatReport(report)} in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    );
    expect(retrying).toBeGreaterThan(0);
    expect(report.rolledBackSeen).toEqual([]);
    expect(report.ok, formatReport(report)).toBe(true);
  }, 180_000);
});
