import { describe, expect, it } from 'vitest';
import { runCrashScenario } from '../../src/cli/crash.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE, runCliOnBroker as cli } from '../support/cli.js';
import { useClient } from '../support/stream.js';

const client = useClient();

// Issue 36, item 5: the broker never deduplicates AMQP 0-9-1, so after a SIGKILL the outbox's
// re-sends are copies in the stream. They are expected, marked `x-dedup-transport: amqp091` by the
// publisher, and `audit` counts them apart; a copy from a stream-protocol writer still fails it.
describe('cli - audit of a stream written over AMQP 0-9-1', () => {
  it('SIGKILLed AMQP publishers: the re-send copies are expected copies, exit 0; a stream-protocol copy still exits 1', async () => {
    const stream = uniqueName('cli-amqp-audit');
    try {
      let copies = 0;
      let messages = 0;
      // Kills after a fraction of the acks: the in-flight window (64) is stored but unconfirmed,
      // so the next life re-sends copies. Rounds until a kill left at least one copy.
      for (let round = 0; round < 5 && copies === 0; round++) {
        const result = await runCrashScenario({
          cli: CLI_FROM_SOURCE,
          stream,
          producerName: 'cli-amqp-audit',
          transport: 'amqp',
          kills: 3,
          perRun: 2_000,
          kill: { afterAcked: [0.2, 0.6] },
        });
        expect(result.report.lost).toEqual([]);
        copies = result.report.extraCopies;
        messages = result.streamMessages;
      }
      console.log(`[cli amqp audit] stream=${messages} messages, copies=${copies}`);
      expect(copies).toBeGreaterThan(0);

      const clean = await cli(['audit', stream, '--json']);
      expect(clean.stderr).toBe('');
      expect(clean.code).toBe(0);
      expect(JSON.parse(clean.stdout)).toMatchObject({
        messages,
        duplicates: 0,
        expectedCopies: copies,
        gaps: 0,
        outOfOrder: 0,
        ok: true,
      });
      const human = await cli(['audit', stream]);
      expect(human.code).toBe(0);
      expect(human.stdout).toContain(`(AMQP 0-9-1 re-sends, not deduplicated by the broker; not a failure)`);
      expect(human.stdout).toContain(
        `audit: OK — no duplicates, no gaps, nothing out of order (${copies} expected`,
      );

      // The same identity again from a stream-protocol writer (unnamed: no broker dedup), unmarked.
      const publisher = await client().declarePublisher({ stream });
      const confirmed = new Promise<void>((resolve) => publisher.on('publish_confirm', () => resolve()));
      await publisher.send(Buffer.from('copy'), {
        applicationProperties: identityHeaders('cli-amqp-audit', 1n),
      });
      await publisher.flush();
      await confirmed;
      await publisher.close();
      const dirty = await cli(['audit', stream, '--json']);
      expect(dirty.code).toBe(1);
      expect(JSON.parse(dirty.stdout)).toMatchObject({
        messages: messages + 1,
        duplicates: 1,
        expectedCopies: copies,
        ok: false,
      });

      // A range from the last offset sees that message alone: its first copy is before the range.
      const last = await cli(['audit', stream, '--json', '--from', String(messages)]);
      expect(last.code).toBe(0);
      expect(JSON.parse(last.stdout)).toMatchObject({
        from: String(messages),
        messages: 1,
        duplicates: 0,
        ok: true,
      });
      const future = await cli(['audit', stream, '--json', '--since', '2999-01-01T00:00:00Z']);
      expect(future.code).toBe(0);
      expect(JSON.parse(future.stdout)).toMatchObject({ since: '2999-01-01T00:00:00.000Z', messages: 0 });
      const bad = await cli(['audit', stream, '--from', '1.5']);
      expect(bad.code).toBe(2);
      expect(bad.stderr).toBe(
        'audit: --from expects an offset, a decimal integer from 0 to 2^64 - 1, got "1.5"\n',
      );
    } finally {
      await client()
        .deleteStream({ stream })
        .catch(() => undefined);
    }
  }, 600_000);
});
