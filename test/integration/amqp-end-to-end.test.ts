import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runCrashScenario } from '../../src/cli/crash.js';
import type { EffectTransaction } from '../../src/consumer/core.js';
import { formatReport } from '../../src/testing.js';
import { AmqpVerifyingConsumer } from '../../src/amqp.js';
import { StreamVerifyingConsumer } from '../../src/stream.js';
import { AMQP_URL, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';
import { connectClient, readAll } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const tempDir = useTempDir();

// docs/design.md §3: the broker never deduplicates AMQP 0-9-1 publishes. After crashes the outbox re-send
// can put a second copy into the stream; the verifying consumer must remove it, so that every
// acknowledged send takes effect exactly once.
describe('amqp 0-9-1 publisher + verifying consumer', () => {
  it('10 SIGKILLs of the producer: the stream may hold copies, every acknowledged message takes effect exactly once', async () => {
    const queue = uniqueName('amqp-e2e');
    const result = await runCrashScenario({
      cli: CLI_FROM_SOURCE,
      stream: queue,
      producerName: 'amqp-e2e-producer',
      transport: 'amqp',
      kills: 10,
      perRun: 20_000,
      kill: { afterMs: [20, 300] },
    });
    // The producer really went through AMQP 0-9-1: its x- headers arrive as message annotations.
    const client = await connectClient();
    const [first] = await readAll(client, queue);
    await client.close();
    expect(first?.messageAnnotations?.['x-dedup-producer']).toBe('amqp-e2e-producer');
    expect(first?.applicationProperties?.['x-dedup-producer']).toBeUndefined();
    // The raw stream: nothing acknowledged is missing; copies are allowed here, and counted.
    expect(result.kills).toBe(10);
    expect(result.report.lost).toEqual([]);
    expect(result.report.unexpected).toEqual([]);

    for (const via of ['amqp', 'stream'] as const) {
      let doubleApplied = 0;
      const handler = async (message: { body: Buffer }, tx: EffectTransaction): Promise<void> => {
        const key = `applied:${message.body.toString()}`;
        if ((await tx.get(key)) !== undefined) doubleApplied++;
        tx.put(key, '1');
        const n = Number(Buffer.from((await tx.get('count')) ?? Buffer.from('0')).toString());
        tx.put('count', String(n + 1));
      };
      const common = { consumerName: `effects-${via}`, store: join(await tempDir(), 'store'), handler };
      const consumer =
        via === 'amqp'
          ? await AmqpVerifyingConsumer.open({ ...common, url: AMQP_URL, queue, prefetch: 500 })
          : await StreamVerifyingConsumer.open({ ...common, connection: STREAM_CONNECTION, stream: queue });
      await consumer.waitForOffset(BigInt(result.streamMessages - 1));
      const applied = Number(Buffer.from((await consumer.readEffect('count'))!).toString());
      const missing: string[] = [];
      for (const label of result.acknowledgedLabels) {
        if ((await consumer.readEffect(`applied:${label}`)) === undefined) missing.push(label);
      }
      const stats = { ...consumer.stats };
      await consumer.close();
      console.log(
        `[amqp e2e via ${via}] kills=${result.kills} acknowledged=${result.acknowledged} stream=${result.streamMessages} ` +
          `copies-in-stream=${result.report.extraCopies} applied=${applied} duplicates-dropped=${stats.duplicate} ` +
          `stale=${stats.stale} ${formatReport(result.report)}`,
      );
      expect(missing).toEqual([]);
      expect(doubleApplied).toBe(0);
      // Each distinct message in the stream applied once: the copies were all recognised.
      expect(applied).toBe(result.streamMessages - result.report.extraCopies);
      expect(stats.duplicate).toBe(result.report.extraCopies);
    }
  }, 600_000);
});
