import { describe, expect, it } from 'vitest';
import { formatAge, formatOutboxStatus, formatOutboxStatusJson } from '../../src/cli/outbox.js';
import type { OutboxStatus } from '../../src/postgres/outbox-status.js';
import { runCli } from '../support/cli.js';

const status: OutboxStatus = {
  schema: 'shop',
  producers: [
    {
      producerName: 'orders-svc',
      waiting: 12,
      numbered: 3,
      oldestAgeMs: 1_234,
      relay: {
        holder: 'a1b2',
        epoch: 4n,
        since: new Date('2026-12-03T15:00:00.000Z'),
        holdsLock: true,
        session: { pid: 4242, clientAddress: '127.0.0.1' },
      },
      targets: [{ target: 'orders', lastAssigned: 1_240n, lastConfirmed: 1_237n }],
    },
    {
      producerName: 'quiet',
      waiting: 0,
      numbered: 0,
      oldestAgeMs: undefined,
      relay: {
        holder: 'c3',
        epoch: 1n,
        since: new Date('2026-12-03T14:00:00.000Z'),
        holdsLock: false,
        session: undefined,
      },
      targets: [{ target: 'q', lastAssigned: 9n, lastConfirmed: 9n }],
    },
  ],
};

describe('stream-dedup outbox status - output', () => {
  it('formats ages from milliseconds to hours', () => {
    expect(formatAge(850.4)).toBe('850 ms');
    expect(formatAge(12_345)).toBe('12.3 s');
    expect(formatAge(245_000)).toBe('4 min 05 s');
    expect(formatAge(11_220_000)).toBe('3 h 07 min');
  });

  it('says per producer: rows waiting, oldest age, who holds the lock, last published id', () => {
    const text = formatOutboxStatus(status);
    expect(text).toContain('producer orders-svc');
    expect(text).toContain('rows waiting:   12 (3 numbered, sent or to re-send, not confirmed)');
    expect(text).toContain('oldest:         1.2 s ago');
    expect(text).toContain(
      'a1b2 holds the lock (epoch 4, since 2026-12-03T15:00:00.000Z, session pid 4242 from 127.0.0.1)',
    );
    expect(text).toContain('last published: orders 1237 (numbered through 1240)');
    expect(text).toContain('none holds the lock (the last, c3, epoch 1');
    expect(text).toContain('last published: q 9');
    expect(formatOutboxStatus({ schema: 's', producers: [] })).toBe(
      'schema s: the outbox is empty and no relay ever ran',
    );
  });

  it('prints JSON with 64-bit integers as decimal strings', () => {
    const parsed = JSON.parse(formatOutboxStatusJson(status)) as {
      producers: Array<{ targets: Array<{ lastAssigned: string }>; relay: { epoch: string } }>;
    };
    expect(parsed.producers[0]!.targets[0]!.lastAssigned).toBe('1240');
    expect(parsed.producers[0]!.relay.epoch).toBe('4');
  });
});

describe('stream-dedup outbox - usage errors exit 2 before any I/O', () => {
  it(
    'refuses a missing sub-command, an unknown one, a missing --schema and a bad schema name',
    { timeout: 60_000 },
    async () => {
      const noDb = { STREAM_DEDUP_PG_URL: 'postgres://nobody:x@127.0.0.1:1/none' };
      const [none, unknown, noSchema, badSchema] = await Promise.all([
        runCli(['outbox'], noDb),
        runCli(['outbox', 'stats'], noDb),
        runCli(['outbox', 'status'], noDb),
        runCli(['outbox', 'status', '--schema', 'Bad-Name'], noDb),
      ]);
      expect(none.code).toBe(2);
      expect(none.stderr).toContain('no sub-command');
      expect(unknown.code).toBe(2);
      expect(unknown.stderr).toContain('unknown sub-command stats');
      expect(noSchema.code).toBe(2);
      expect(noSchema.stderr).toContain('--schema is required');
      expect(badSchema.code).toBe(2);
      expect(badSchema.stderr).toContain('Expected schema to be');
    },
  );
});
