import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  changelogStreamName,
  checkGroupName,
  SuperStreamVerifyingConsumer,
} from '../../src/group/consumer.js';
import { memoryStore } from '../support/memory-store.js';

/** True when `open()`'s name check lets the group name through. */
function accepted(consumerName: string): boolean {
  try {
    checkGroupName(consumerName);
    return true;
  } catch {
    return false;
  }
}

describe('consumer group names - one changelog per (partition, group)', () => {
  it("refuses a group name with a '.' before any I/O (DEDUP_UNSAFE_OPTIONS): it could share another group's changelog", async () => {
    const store = await memoryStore();
    // Port 1: nothing listens. Any I/O would fail otherwise (DEDUP_BROKER_UNREACHABLE).
    const err: unknown = await SuperStreamVerifyingConsumer.open({
      superStream: 'orders',
      consumerName: 'west.billing',
      store,
      handler: () => undefined,
      connection: { hostname: '127.0.0.1', port: 1 },
    }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_UNSAFE_OPTIONS' });
    expect((err as Error).message).toContain('west.billing');
    await store.close();
  });

  it('refuses, before any I/O, a tenantVersion without a tenant function, empty, too long or not a string', async () => {
    const store = await memoryStore();
    const cases: [unknown, unknown, RegExp][] = [
      ['v1', undefined, /^Expected tenantVersion to be given only with tenant/],
      ['', () => '', /^Expected tenantVersion to be a non-empty string of at most 64 UTF-8 bytes/],
      [
        'é'.repeat(33),
        () => '',
        /^Expected tenantVersion to be a non-empty string of at most 64 UTF-8 bytes/,
      ],
      [1, () => '', /^Expected tenantVersion to be a string/],
    ];
    for (const [tenantVersion, tenant, message] of cases) {
      const err: unknown = await SuperStreamVerifyingConsumer.open({
        superStream: 'orders',
        consumerName: 'billing',
        store,
        handler: () => undefined,
        tenant: tenant as never,
        tenantVersion: tenantVersion as never,
        connection: { hostname: '127.0.0.1', port: 1 },
      }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(Error);
      expect((err as Error).message).toMatch(message);
    }
    await store.close();
  });

  it('refuses, before any I/O, a group name whose changelog producer name its own readers would call malformed', async () => {
    // A C1 control character, U+FFFD: 0.6.0's readers take such a name as malformed, so a group
    // under it wrote changelogs that every take-over refused (hostile review of the merged change).
    const store = await memoryStore();
    for (const consumerName of ['billing\u0085eu', 'caf\uFFFD', 'tab\there']) {
      const err: unknown = await SuperStreamVerifyingConsumer.open({
        superStream: 'orders',
        consumerName,
        store,
        handler: () => undefined,
        connection: { hostname: '127.0.0.1', port: 1 },
      }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(TypeError);
      expect((err as Error).message).toMatch(/^Expected consumerName to be a valid producer name/);
    }
    await store.close();
  });

  it('maps distinct (partition, group) pairs it accepts to distinct changelogs, dots in partition names included', () => {
    const name = fc.string({ unit: fc.constantFrom('a', 'b', '.', '-'), minLength: 1, maxLength: 8 });
    fc.assert(
      fc.property(name, name, (partition, group) => {
        fc.pre(accepted(group));
        // Every other (partition, group) whose changelog has this name: a split at another '.'.
        const stem = changelogStreamName(partition, group).slice(0, -'.changelog'.length);
        for (let i = stem.indexOf('.'); i !== -1; i = stem.indexOf('.', i + 1)) {
          const other = { partition: stem.slice(0, i), group: stem.slice(i + 1) };
          if (other.partition === '' || other.group === '' || !accepted(other.group)) continue;
          expect(other).toEqual({ partition, group });
        }
      }),
      { numRuns: 1_000 },
    );
  });
});
