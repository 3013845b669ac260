import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { identityHeaders } from '../../src/identity/headers.js';
import { StreamVerifyingConsumer } from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();

/** Polls `condition` every 10 ms (there is no event for what the client buffered). */
async function until(condition: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('stream verifying consumer - memory stays bounded behind a slow handler', () => {
  it('stops asking for chunks while 20 000 delivered messages wait, and applies all once the handler resumes', async () => {
    const stream = uniqueName('backlog');
    await client().createStream({ stream, arguments: {} });
    const total = 80_000;
    const publisher = await client().declarePublisher({ stream });
    let confirmed = 0;
    const allConfirmed = new Promise<void>((resolve) =>
      publisher.on('publish_confirm', (_e, ids) => {
        confirmed += ids.length;
        if (confirmed >= total) resolve();
      }),
    );
    for (let i = 1; i <= total; i++) {
      await publisher.send(Buffer.from(String(i)), {
        applicationProperties: identityHeaders('p', BigInt(i)),
      });
    }
    await publisher.flush();
    await allConfirmed;
    await publisher.close();

    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let applied = 0;
    const consumer = await StreamVerifyingConsumer.open({
      connection: STREAM_CONNECTION,
      stream,
      consumerName: 'slow',
      store: join(await tempDir(), 'store'),
      handler: async () => {
        await gate;
        applied++;
      },
    });
    try {
      await until(() => consumer.buffered >= 20_000, 30_000, '20 000 buffered messages');
      // Proving that nothing more arrives needs a wait: half a second is ~10x the time the broker
      // takes to deliver the remaining 60 000 messages to a consumer with credit.
      await new Promise((r) => setTimeout(r, 500));
      const held = consumer.buffered;
      // One chunk may be in flight when the credit is held back.
      expect(held).toBeLessThan(30_000);
      release();
      await consumer.waitForOffset(BigInt(total - 1));
      expect(applied).toBe(total);
      expect(consumer.stats.new).toBe(total);
      console.log(`[backlog] buffered while the handler waited: ${held} of ${total}`);
    } finally {
      release();
      await consumer.close();
    }
  });
});
