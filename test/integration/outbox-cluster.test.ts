/**
 * The outbox relay with its stream's leader killed (kill -9) on the three-node cluster of
 * scripts/rabbitmq.sh (issue 35), while the application commits from 8 concurrent transactions:
 * the relay reconnects to the new leader, re-sends what was not confirmed under the same IDs, and
 * the stream holds every committed row once, none rolled back, keys in commit order.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { formatReport } from '../../src/history/checker.js';
import { PgOutbox, PgOutboxRelay, type OutboxRelayEvent } from '../../src/postgres.js';
import { readStreamToEnd } from '../../src/transport/stream-ops.js';
import { uniqueName } from '../support/broker.js';
import { CLUSTER_CONNECTION, clusterScript, leaderNode, useCluster, withAdmin } from '../support/cluster.js';
import {
  checkOutbox,
  createTruthTable,
  readTruth,
  runApplication,
  type Enqueue,
} from '../support/outbox-app.js';
import { waitForEmptyOutbox } from '../support/outbox-relay.js';
import { connectPool, useSchema } from '../support/postgres.js';

useCluster();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

describe('outbox relay - cluster', () => {
  it('the stream leader killed under the relay: nothing lost, nothing doubled, keys in commit order', async () => {
    const started = performance.now();
    const db = await useSchema();
    cleanups.push(db.drop);
    const { pool, schema } = db;
    await createTruthTable(pool, schema);
    const stream = uniqueName('outbox-cluster');
    await withAdmin((c) => c.createStream({ stream, arguments: { 'initial-cluster-size': 3 } }));
    cleanups.push(() =>
      withAdmin(async (c) => void (await c.deleteStream({ stream }))).catch(() => undefined),
    );
    // Replicas come up a moment after the declaration; there is no event for it.
    for (let i = 0; i < 100 && (await leaderNode(stream)).replicas < 2; i++) await sleep(100);
    expect((await leaderNode(stream)).replicas).toBe(2);

    const producerName = 'outbox-cluster';
    const outbox = PgOutbox.create({ schema, producerName });
    const enqueue: Enqueue = (c, body, options) => outbox.enqueue(c, body, options);
    const events: Array<OutboxRelayEvent & { at: number }> = [];
    const relayPool = await connectPool();
    cleanups.push(() => relayPool.end());
    const relay = await PgOutboxRelay.open({
      pool: relayPool,
      schema,
      producerName,
      stream,
      connection: CLUSTER_CONNECTION,
      pollIntervalMs: 200,
      reconnect: { initialDelayMs: 100, maxDelayMs: 500 },
      onEvent: (e) => events.push({ ...e, at: performance.now() }),
    });
    cleanups.push(() => relay.close());
    const stop = new AbortController();
    const app = runApplication({ pool, schema, enqueue, transactionsPerWorker: 10_000, signal: stop.signal });
    while (events.filter((e) => e.type === 'confirmed').length < 3) await sleep(20);
    const { node } = await leaderNode(stream);
    const killStarted = performance.now();
    await clusterScript('node-kill', String(node));
    const killedAt = performance.now();
    while (!events.some((e) => e.type === 'confirmed' && e.at > killedAt)) await sleep(20);
    const resumedAt = performance.now();
    await sleep(500);
    stop.abort();
    const result = await app;
    await waitForEmptyOutbox(pool, schema, producerName);
    await relay.close();
    await clusterScript('node-start', String(node));

    const truth = await readTruth(pool, schema);
    const records = await readStreamToEnd(CLUSTER_CONNECTION, stream, { timeoutMs: 60_000 });
    const report = checkOutbox(
      truth,
      result.rolledBack,
      records.map((r) => r.body),
    );
    console.log(
      `[outbox cluster] leader node${node} killed; first confirm ${(resumedAt - killedAt).toFixed(0)} ms later; ` +
        `retrying=${events.filter((e) => e.type === 'retrying').length} rows=${truth.length} stream=${records.length} ` +
        `${formatReport(report)} in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    );
    expect(report.rolledBackSeen).toEqual([]);
    expect(report.ok, formatReport(report)).toBe(true);
    // The kill reached the relay: its producer's connection (to the leader) broke and it retried.
    // (Counted from the kill's start: the relay can notice before the script returns.)
    expect(events.filter((e) => e.type === 'retrying' && e.at > killStarted).length).toBeGreaterThan(0);
  }, 180_000);
});
