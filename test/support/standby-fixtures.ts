// Fixtures of the standby tail's unit tests (test/group/standby-*.test.ts): four partitions of group
// "billing", a changelog history per partition (entry n puts k<n % 3> and the offset record), a
// sorted in-memory store, and a copy's keys as hex.
import { EventEmitter } from 'node:events';
import type { Client } from 'rabbitmq-stream-js-client';
import type { KeyValueDb } from '../../src/store/store.js';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { standbyView } from '../../src/group/standby-copy.js';
import { namespaceRanges } from '../../src/group/snapshot-entry.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import type { ChangelogRecordSpec, FakeChangelog } from './changelog-client.js';

export const OURS = changelogProducerName('billing');
export const partitions = Array.from({ length: 4 }, (_, i) => `orders-${i}`);
export const namespaceOf = (p: string): string => partitionNamespace('billing', p);
export const changelogOf = (p: string): string => `${p}.billing.changelog`;

export function history(partition: string, n: number): ChangelogRecordSpec[] {
  const ns = namespaceOf(partition);
  return [
    { producer: OURS, id: GENESIS_ID, content: () => encodeGenesis(0n) },
    ...Array.from({ length: n }, (_, last) => ({
      producer: OURS,
      id: entryId(BigInt(last)),
      content: () =>
        encodeEntry({
          lastOffset: BigInt(last),
          baseOffset: last === 0 ? undefined : BigInt(last - 1),
          ops: [
            { type: 'put' as const, key: `${effectKeyPrefix(ns)}k${last % 3}`, value: Buffer.from([last]) },
            { type: 'put' as const, key: offsetKey(ns), value: encodeOffset(BigInt(last)) },
          ],
        }),
    })),
  ];
}

/** A store as the restore sees it: sorted keys, atomic batches. */
export function memoryDb(): KeyValueDb {
  const kv = new Map<string, Uint8Array>();
  return {
    status: 'open',
    open: () => Promise.resolve(),
    close: () => Promise.resolve(),
    get: (k) => Promise.resolve(kv.get(k)),
    batch: (ops) => {
      for (const op of ops) {
        if (op.type === 'put') kv.set(op.key, op.value);
        else kv.delete(op.key);
      }
      return Promise.resolve();
    },
    iterator: ({ gte, lt }) => {
      const entries = [...kv].filter(([k]) => k >= gte && k < lt).sort(([a], [b]) => (a < b ? -1 : 1));
      const it = entries[Symbol.iterator]();
      const iterator = {
        next: () => Promise.resolve(it.next()),
        close: () => Promise.resolve(),
        [Symbol.asyncIterator]: () => iterator,
      };
      return iterator as ReturnType<KeyValueDb['iterator']>;
    },
  };
}

export async function copyOf(db: KeyValueDb, partition: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const range of namespaceRanges(namespaceOf(partition))) {
    for await (const [k, v] of standbyView(db).iterator(range)) out[k] = Buffer.from(v).toString('hex');
  }
  return out;
}

/** A Deliver frame (version 1, subscription 0) whose chunk has no valid magic: it does not decode. */
const HOSTILE_FRAME = (() => {
  const body = Buffer.concat([Buffer.from([0x00, 0x08, 0x00, 0x01, 0x00]), Buffer.alloc(60, 0xff)]);
  const size = Buffer.alloc(4);
  size.writeUInt32BE(body.length);
  return Buffer.concat([size, body]);
})();

/**
 * One client for several changelogs (the real client routes by stream name), counting the last-ID
 * queries (one per tail step) per changelog. A changelog in `hostile` answers its subscription with
 * a frame that does not decode, through the connection decoder the library hooks.
 */
export function multiClient(
  changelogs: ReadonlyMap<string, FakeChangelog>,
  hostile: ReadonlySet<string>,
  steps: Map<string, number>,
): Client {
  const fakes = new Map([...changelogs].map(([name, c]) => [name, c.client()]));
  const fakeOf = (stream: string): Client => fakes.get(stream)!;
  const decoder = {
    add: (_data: Buffer, _compression: unknown): void => undefined,
    emitter: new EventEmitter(),
    lastData: Buffer.alloc(0),
  };
  const connection = { decoder };
  const client = {
    getConnection: () => Promise.resolve(connection),
    locatorConnection: {
      queryPublisherSequence: (q: { stream: string; publisherRef: string }) => {
        steps.set(q.stream, (steps.get(q.stream) ?? 0) + 1);
        return (
          fakeOf(q.stream) as unknown as {
            locatorConnection: { queryPublisherSequence: (x: unknown) => Promise<bigint> };
          }
        ).locatorConnection.queryPublisherSequence(q);
      },
    },
    queryOffset: (q: { stream: string }) => fakeOf(q.stream).queryOffset(q as never),
    streamStatsRequest: (stream: string) => fakeOf(stream).streamStatsRequest(stream),
    declareConsumer: async (params: { stream: string }, handler: never) => {
      if (hostile.has(params.stream)) {
        // The client's getConnection, as the library hooked it: its decoder reads the frame.
        const hooked = (await client.getConnection()).decoder;
        setImmediate(() => hooked.add(HOSTILE_FRAME, undefined));
        return { extendedId: params.stream };
      }
      await fakeOf(params.stream).declareConsumer(params as never, handler);
      return { extendedId: params.stream };
    },
    closeConsumer: (id: string) => fakeOf(id).closeConsumer(id),
    close: () => Promise.resolve(),
  };
  return client as unknown as Client;
}
