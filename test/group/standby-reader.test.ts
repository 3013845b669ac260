/**
 * The standby tail's reader client (docs/design.md §12.3): one client for every copy and step,
 * replaced only after a failed step. It opened a new reader connection per copy per 250 ms step
 * (rev5 S1): past ~5 copies a round outgrew the interval (copies lagged n × ~50 ms) and the broker
 * saw 4 connections a second per copy. A frame that does not decode on one changelog must still be
 * reported, fail only that copy's step, and never be read past.
 */
import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import type { Client } from 'rabbitmq-stream-js-client';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from '../../src/group/changelog-entry.js';
import { changelogProducerName, partitionNamespace } from '../../src/group/consumer.js';
import { standbyView } from '../../src/group/standby-copy.js';
import { StandbyTailer } from '../../src/group/standby-tail.js';
import { namespaceRanges } from '../../src/group/snapshot-entry.js';
import { effectKeyPrefix, encodeOffset, offsetKey } from '../../src/store/consumer-keys.js';
import type { KeyValueDb } from '../../src/store/store.js';
import { FakeChangelog, type ChangelogRecordSpec } from '../support/changelog-client.js';

const OURS = changelogProducerName('billing');
const partitions = Array.from({ length: 4 }, (_, i) => `orders-${i}`);
const namespaceOf = (p: string): string => partitionNamespace('billing', p);
const changelogOf = (p: string): string => `${p}.billing.changelog`;

function history(partition: string, n: number): ChangelogRecordSpec[] {
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
function memoryDb(): KeyValueDb {
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

async function copyOf(db: KeyValueDb, partition: string): Promise<Record<string, string>> {
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
function multiClient(
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

function tailer(o: {
  db: KeyValueDb;
  connect: () => Promise<Client>;
  warnings?: string[];
  intervalMs?: number;
}): StandbyTailer {
  return new StandbyTailer({
    db: o.db,
    sync: false,
    consumerName: 'billing',
    partitions: partitions.map((p) => ({
      partition: p,
      namespace: namespaceOf(p),
      changelog: changelogOf(p),
    })),
    replicas: partitions.length,
    producerName: OURS,
    settings: undefined,
    isActive: () => false,
    connect: o.connect,
    restoreTimeoutMs: 5_000,
    log: {
      debug: () => undefined,
      info: () => undefined,
      error: () => undefined,
      warn: (fields, m) => o.warnings?.push(`${m ?? ''} ${JSON.stringify(fields)}`),
    },
    intervalMs: o.intervalMs ?? 2,
  });
}

describe('warm standbys - the tail keeps one reader client (§12.3)', () => {
  it('reads 4 copies for 25 steps each on one client (was: a client per copy per step)', async () => {
    const db = memoryDb();
    const changelogs = new Map(
      partitions.map((p, i) => [changelogOf(p), new FakeChangelog(history(p, 5 + i))]),
    );
    const steps = new Map<string, number>();
    let connects = 0;
    let closes = 0;
    const t = tailer({
      db,
      connect: () => {
        connects++;
        const client = multiClient(changelogs, new Set(), steps);
        return Promise.resolve(Object.assign(client, { close: () => Promise.resolve(void closes++) }));
      },
    });
    await expect
      .poll(() => Math.min(...partitions.map((p) => steps.get(changelogOf(p)) ?? 0)), { timeout: 20_000 })
      .toBeGreaterThanOrEqual(25);
    await t.close();
    expect(connects).toBe(1);
    expect(closes).toBe(1);
    for (const p of partitions) {
      const alone = memoryDb();
      const single = tailer({
        db: alone,
        connect: () => Promise.resolve(multiClient(changelogs, new Set(), new Map())),
      });
      await expect
        .poll(async () => Object.keys(await copyOf(alone, p)).length, { timeout: 5_000 })
        .toBeGreaterThan(0);
      await single.close();
      expect(await copyOf(db, p)).toEqual(await copyOf(alone, p));
    }
  });

  it('a frame that does not decode on one changelog fails that copy only, is reported, replaces the client and is never read past', async () => {
    const db = memoryDb();
    const changelogs = new Map(partitions.map((p) => [changelogOf(p), new FakeChangelog(history(p, 6))]));
    const bad = changelogOf(partitions[2]!);
    const steps = new Map<string, number>();
    const warnings: string[] = [];
    let connects = 0;
    const t = tailer({
      db,
      warnings,
      intervalMs: 5,
      connect: () => {
        connects++;
        return Promise.resolve(multiClient(changelogs, new Set([bad]), steps));
      },
    });
    // Two failures of the hostile copy (the second after its backoff), the others tailed meanwhile.
    await expect.poll(() => warnings.length, { timeout: 10_000 }).toBeGreaterThanOrEqual(2);
    await expect
      .poll(() => Math.min(...partitions.map((p) => steps.get(changelogOf(p)) ?? 0)), { timeout: 10_000 })
      .toBeGreaterThanOrEqual(3);
    await t.close();
    for (const w of warnings) {
      expect(w).toContain('tailing a standby copy failed');
      expect(w).toContain(`cannot read changelog \\"${bad}\\"`);
      expect(w).toContain(`"partition":"${partitions[2]}"`);
    }
    // A client replaced after each failed step only: one per failure, plus the first.
    expect(connects).toBe(warnings.length + 1);
    // The hostile copy holds nothing read past the bad frame; the others are whole.
    expect(await copyOf(db, partitions[2]!)).toEqual({});
    for (const p of partitions.filter((q) => changelogOf(q) !== bad))
      expect(Object.keys(await copyOf(db, p)).length).toBeGreaterThan(0);
  });
});
