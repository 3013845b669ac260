// The snapshot writer's byte cap is checked before anything is sent (docs/design.md §12.1): a state
// past the cap used to be noticed only while its parts went out, leaving up to the cap's bytes of
// parts without a marker in the changelog each time such a snapshot was due.
import type { Client } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { encodeEntry, entryId } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { OP_OVERHEAD_BYTES, snapshotProducerName } from '../../src/group/snapshot-entry.js';
import { SnapshotWriter } from '../../src/group/snapshot-writer.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import { FakeChangelog } from '../support/changelog-client.js';

const NAMESPACE = partitionNamespace('billing', 'orders');
const OURS = changelogProducerName('billing');
const SNAP = snapshotProducerName(OURS);
const KEYS = 40;
const VALUE = Buffer.alloc(100, 0x61);
const effect = (i: number): string => `${effectKeyPrefix(NAMESPACE)}k${String(i).padStart(2, '0')}`;
/** What the cap counts for one of the state's effect keys. */
const KEY_BYTES = OP_OVERHEAD_BYTES + Buffer.byteLength(effect(0)) + VALUE.length;

async function setUp() {
  const db = new FakeChangelog([]).db(NAMESPACE);
  await db.batch([
    { type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(9n) },
    ...Array.from({ length: KEYS }, (_, i) => ({
      type: 'put' as const,
      key: effect(i),
      value: VALUE,
    })),
  ]);
  const appended: bigint[] = [];
  const brokerCalls: string[] = [];
  const client = {
    locatorConnection: {
      queryPublisherSequence: ({ publisherRef }: { publisherRef: string }) => {
        brokerCalls.push(`last ID of ${publisherRef}`);
        return Promise.resolve(publisherRef === SNAP ? 0n : entryId(9n));
      },
      storeOffset: () => {
        brokerCalls.push('store reference');
        return Promise.resolve();
      },
    },
    streamStatsRequest: () => {
      brokerCalls.push('stats');
      return Promise.resolve({ firstChunkId: 0n, committedChunkId: 20n, lastChunkId: 20n });
    },
  } as unknown as Client;
  const writer = (maxBytes: number) =>
    new SnapshotWriter({
      db,
      namespace: NAMESPACE,
      changelog: 'orders.billing.changelog',
      entryProducer: OURS,
      producer: SNAP,
      policy: { everyEntries: 1, everyBytes: 0 },
      // A key or two a part: the state is tens of parts.
      writer: {
        maxEntryBytes: 300,
        append: (_message, id) => {
          appended.push(id);
          return Promise.resolve('landed');
        },
      },
      timeoutMs: 1_000,
      maxBytes,
    });
  return { client, writer, appended, brokerCalls };
}

describe('snapshot writer: the byte cap checked before writing', () => {
  it('a state past the cap sends nothing (no part, no marker, no broker call) and says how large it is', async () => {
    const { client, writer, appended, brokerCalls } = await setUp();
    // Half the state: the old writer appended the parts before the cap was noticed.
    const cap = (KEYS / 2) * KEY_BYTES;
    const outcome = await writer(cap).write(client, () => true);
    expect({ appended: appended.length, brokerCalls }).toEqual({ appended: 0, brokerCalls: [] });
    expect(outcome).toMatchObject({ kind: 'too-large', maxBytes: cap });
    // Counted up to the first key past the cap, not the whole state.
    expect(outcome.kind === 'too-large' && outcome.bytes).toBeGreaterThan(cap);
    expect(outcome.kind === 'too-large' && outcome.bytes).toBeLessThanOrEqual(cap + KEY_BYTES);
  });

  it('a state under the cap is written whole, as before', async () => {
    const { client, writer, appended, brokerCalls } = await setUp();
    const outcome = await writer(100_000).write(client, () => true);
    expect(outcome).toMatchObject({ kind: 'written', offset: 9n, keys: KEYS + 1 });
    // Its parts and the marker.
    expect(appended.length).toBe(outcome.kind === 'written' ? outcome.parts + 1 : -1);
    expect(brokerCalls).toContain('store reference');
  });
});

// The writer read the state twice per snapshot (once to count it against the cap, once to write
// it): now the last snapshot's count and the entries appended since bound it, and only a snapshot
// whose bound is unknown (the first, a break in the chain) or past the cap counts first.
describe('snapshot writer: one read of the state per snapshot', () => {
  /** The store of setUp, counting the keys its namespace iterators yield. */
  async function counting() {
    const db = new FakeChangelog([]).db(NAMESPACE);
    let keysRead = 0;
    const inner = db.iterator.bind(db);
    db.iterator = (range) => {
      const it = inner(range);
      const wrapped = {
        next: async () => {
          const r = await it.next();
          if (!r.done) keysRead++;
          return r;
        },
        close: () => it.close(),
        [Symbol.asyncIterator]: () => wrapped,
      };
      return wrapped as ReturnType<typeof db.iterator>;
    };
    await db.batch([
      { type: 'put', key: offsetKey(NAMESPACE), value: encodeOffset(9n) },
      ...Array.from({ length: KEYS }, (_, i) => ({ type: 'put' as const, key: effect(i), value: VALUE })),
    ]);
    let offset = 9n;
    /** A batch committed and its entry appended: one more key, noted as the strategy notes it. */
    const commit = async (writer: SnapshotWriter, chained = true): Promise<void> => {
      const ops = [
        { type: 'put' as const, key: effect(100 + Number(offset)), value: VALUE },
        { type: 'put' as const, key: offsetKey(NAMESPACE), value: encodeOffset(offset + 1n) },
      ];
      const entry = { baseOffset: chained ? offset : offset - 1n, lastOffset: offset + 1n, ops };
      writer.noteEntry(encodeEntry(entry).length, entry);
      await db.batch(ops);
      offset++;
      lastEntry.id = entryId(offset);
    };
    const lastEntry = { id: entryId(9n) };
    const client = {
      locatorConnection: {
        queryPublisherSequence: ({ publisherRef }: { publisherRef: string }) =>
          Promise.resolve(publisherRef === SNAP ? 0n : lastEntry.id),
        storeOffset: () => Promise.resolve(),
      },
      streamStatsRequest: () =>
        Promise.resolve({ firstChunkId: 0n, committedChunkId: 20n, lastChunkId: 20n }),
    } as unknown as Client;
    const writer = (maxBytes: number) =>
      new SnapshotWriter({
        db,
        namespace: NAMESPACE,
        changelog: 'orders.billing.changelog',
        entryProducer: OURS,
        producer: SNAP,
        policy: { everyEntries: 1, everyBytes: 0 },
        writer: {
          maxEntryBytes: 300,
          append: () => {
            sent++;
            return Promise.resolve('landed');
          },
        },
        timeoutMs: 1_000,
        maxBytes,
      });
    let sent = 0;
    return {
      client,
      writer,
      commit,
      keysRead: () => keysRead,
      sent: () => sent,
      reset: () => {
        keysRead = 0;
        sent = 0;
      },
    };
  }

  it('reads the state once per snapshot after the first; counts first again after a break in the chain', async () => {
    const t = await counting();
    const w = t.writer(100_000);
    // The first: counted, then written (the state's keys: the offset record and 40 effects).
    expect(await w.write(t.client, () => true)).toMatchObject({ kind: 'written', keys: KEYS + 1 });
    expect(t.keysRead()).toBe(2 * (KEYS + 1));
    for (let n = 1; n <= 3; n++) {
      t.reset();
      await t.commit(w);
      expect(await w.write(t.client, () => true)).toMatchObject({ kind: 'written', keys: KEYS + 1 + n });
      expect(t.keysRead()).toBe(KEYS + 1 + n);
    }
    // An entry not based on the last one (another activation's restore came between): counted first.
    t.reset();
    await t.commit(w, false);
    expect(await w.write(t.client, () => true)).toMatchObject({ kind: 'written', keys: KEYS + 5 });
    expect(t.keysRead()).toBe(2 * (KEYS + 5));
  });

  it('a state that grows past the cap through its entries is refused before anything is sent', async () => {
    const t = await counting();
    // Room for the state and two more keys.
    const cap = (KEYS + 3) * KEY_BYTES;
    const w = t.writer(cap);
    expect(await w.write(t.client, () => true)).toMatchObject({ kind: 'written' });
    for (let n = 0; n < 4; n++) await t.commit(w);
    t.reset();
    const outcome = await w.write(t.client, () => true);
    expect(outcome).toMatchObject({ kind: 'too-large', maxBytes: cap });
    expect(t.sent()).toBe(0);
  });
});
