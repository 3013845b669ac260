/**
 * `stream-dedup inspect`: what a LevelDB store holds — producers with their IDs and outbox, super
 * stream producers with the same per partition, verifying consumers with their committed offsets,
 * and verifier scopes. Reading needs an opened {@link DedupStore} (and so its lock); the rest is pure.
 */
import { DedupError } from '../errors.js';
import { decodeScopeKey } from '../identity/scope-key.js';
import { decodePartitionList, decodeSegment, type IdMode } from '../store/codec.js';
import {
  consumerOfOffsetKey,
  decodeOffset,
  decodeScopeState,
  OFFSET_KEYS,
  SCOPE_STATE_KEYS,
  scopeKeyOfStateKey,
} from '../store/consumer-keys.js';
import type { DedupStore } from '../store/store.js';
import type { PolicySpec } from '../verifier/index.js';
import { CliError, formatTable, plural, printable, toJson } from './output.js';

/** One producer's state in the store. */
export interface ProducerInspection {
  /** The stream (or AMQP queue) the producer publishes into. */
  readonly target: string;
  readonly producerName: string;
  readonly idMode: IdMode;
  /**
   * The store's meta.lastId: with an outbox, the highest ID handed out; written by a `reserve` block,
   * the last ID below every message then unconfirmed (its reserved ceiling is `reservedUpTo`).
   */
  readonly lastId: bigint;
  /** In `reserve` durability, the end of the reserved block (0 otherwise). */
  readonly reservedUpTo: bigint;
  /** Messages waiting in the outbox for their confirm (re-sent on the next open). */
  readonly outboxMessages: number;
  /** Outbox records (one per group commit). */
  readonly outboxSegments: number;
  /** The lowest and highest publishing ID in the outbox, when it is not empty. */
  readonly outboxFirstId: bigint | undefined;
  readonly outboxLastId: bigint | undefined;
}

/** One verifying consumer's committed position. */
export interface ConsumerInspection {
  readonly consumerName: string;
  /** The offset of the last message whose effect is committed; the consumer resumes after it. */
  readonly committedOffset: bigint;
}

/** One verifier scope: (consumer, tenant, producer) and its sequence memory. */
export interface ScopeInspection {
  readonly consumer: string;
  readonly tenant: string;
  readonly producer: string;
  readonly policy: PolicySpec;
  /** The highest publishing ID recorded. */
  readonly highest: bigint;
  /** When the scope last committed a message, in ms since the epoch. */
  readonly lastSeenMs: number;
  /** The same as an ISO 8601 time, or `undefined` when it is out of `Date`'s range. */
  readonly lastSeen: string | undefined;
}

/** One partition of a super stream producer: its name and the producer's state there. */
export interface PartitionInspection {
  readonly partition: string;
  /** `undefined` while nothing was ever sent to this partition (no state written yet). */
  readonly state: ProducerInspection | undefined;
}

/** A super stream producer: the partitions it last opened with (the store's `s:` record), each with its state. */
export interface SuperStreamInspection {
  readonly superStream: string;
  readonly producerName: string;
  /** In the broker's order, as recorded. */
  readonly partitions: readonly PartitionInspection[];
}

/** What {@link inspectStore} found. */
export interface StoreInspection {
  /** Producers of streams and queues; a super stream's partitions are under {@link StoreInspection.superStreams}. */
  readonly producers: readonly ProducerInspection[];
  readonly superStreams: readonly SuperStreamInspection[];
  readonly consumers: readonly ConsumerInspection[];
  readonly scopes: readonly ScopeInspection[];
}

/**
 * Reads the producers, super stream producers, verifying consumers and verifier scopes of an
 * opened store, each list sorted by name (a super stream's partitions in their recorded order).
 * A partition's state appears under its super stream producer only, not among the producers.
 * Writes nothing.
 *
 * The engine of `stream-dedup inspect`, whose command line is the public interface.
 *
 * @internal
 * @throws DedupError `DEDUP_STORE_CORRUPT` when a record cannot be decoded.
 */
export async function inspectStore(store: DedupStore): Promise<StoreInspection> {
  const db = store.db;
  const allProducers: ProducerInspection[] = [];
  for (const { target, producerName, meta } of await store.listProducers()) {
    // The key layout of store.ts: `p:` + length-prefixed target and name, segments under `/o/`.
    const prefix = `p:${target.length}:${target}${producerName.length}:${producerName}`;
    let outboxMessages = 0;
    let outboxSegments = 0;
    let outboxFirstId: bigint | undefined;
    let outboxLastId: bigint | undefined;
    for await (const [key, value] of db.iterator({ gte: `${prefix}/o/`, lt: `${prefix}/o0` })) {
      const entries = decodeSegment(value, key);
      outboxSegments++;
      outboxMessages += entries.length;
      outboxFirstId ??= entries[0]!.publishingId;
      outboxLastId = entries[entries.length - 1]!.publishingId;
    }
    allProducers.push({
      target,
      producerName,
      idMode: meta.idMode,
      lastId: meta.lastId,
      reservedUpTo: meta.reservedUpTo,
      outboxMessages,
      outboxSegments,
      outboxFirstId,
      outboxLastId,
    });
  }

  const { superStreams, producers } = await readSuperStreams(db, allProducers);

  const consumers: ConsumerInspection[] = [];
  for await (const [key, value] of db.iterator(OFFSET_KEYS)) {
    const consumerName = consumerOfOffsetKey(key);
    if (consumerName === undefined) throw corrupt(key, 'not a consumer offset key');
    consumers.push({ consumerName, committedOffset: decodeRecord(key, () => decodeOffset(value)) });
  }

  const scopes: ScopeInspection[] = [];
  for await (const [key, value] of db.iterator(SCOPE_STATE_KEYS)) {
    scopes.push(scopeInspection(key, scopeKeyOfStateKey(key), value));
  }
  producers.sort(
    byKeys(
      (p) => p.target,
      (p) => p.producerName,
    ),
  );
  consumers.sort(byKeys((c) => c.consumerName));
  scopes.sort(
    byKeys(
      (s) => s.consumer,
      (s) => s.tenant,
      (s) => s.producer,
    ),
  );
  superStreams.sort(
    byKeys(
      (x) => x.superStream,
      (x) => x.producerName,
    ),
  );
  return { producers, superStreams, consumers, scopes };
}

/** One scope's record (`key` names it in errors), decoded. */
function scopeInspection(key: string, scopeKey: string, value: Uint8Array): ScopeInspection {
  const scope = decodeRecord(key, () => decodeScopeKey(scopeKey));
  const { tracker, lastSeenMs } = decodeRecord(key, () => decodeScopeState(value, scopeKey));
  const date = new Date(lastSeenMs);
  return {
    ...scope,
    policy: tracker.spec,
    highest: tracker.highest,
    lastSeenMs,
    lastSeen: Number.isNaN(date.getTime()) ? undefined : date.toISOString(),
  };
}

/** A PostgreSQL store's rows, as the PostgreSQL reader returns them (src/postgres/inspect.ts). */
export interface PostgresRows {
  readonly offsets: ReadonlyArray<{
    readonly consumer: string;
    readonly committedOffset: bigint | undefined;
  }>;
  readonly scopes: ReadonlyArray<{ readonly scopeKey: string; readonly state: Uint8Array }>;
}

/**
 * What a PostgreSQL store holds, in the LevelDB view's shape: its verifying consumers (those whose
 * offset row has a committed offset; a consumer opened and never committed has none) and verifier
 * scopes, sorted as {@link inspectStore} sorts them. It holds no producers.
 *
 * @internal
 * @throws DedupError `DEDUP_STORE_CORRUPT` when a scope cannot be decoded.
 */
export function inspectPostgresRows(rows: PostgresRows): StoreInspection {
  const consumers: ConsumerInspection[] = [];
  for (const { consumer, committedOffset } of rows.offsets) {
    if (committedOffset !== undefined) consumers.push({ consumerName: consumer, committedOffset });
  }
  const scopes = rows.scopes.map(({ scopeKey, state }) =>
    scopeInspection(`scope_states ${scopeKey}`, scopeKey, state),
  );
  consumers.sort(byKeys((c) => c.consumerName));
  scopes.sort(
    byKeys(
      (s) => s.consumer,
      (s) => s.tenant,
      (s) => s.producer,
    ),
  );
  return { producers: [], superStreams: [], consumers, scopes };
}

/**
 * The `s:` records (store.ts: `s:` + length-prefixed super stream and producer name, the value a
 * partition list), each partition with its producer state; and the producers left, of no partition.
 */
async function readSuperStreams(
  db: DedupStore['db'],
  all: readonly ProducerInspection[],
): Promise<{ superStreams: SuperStreamInspection[]; producers: ProducerInspection[] }> {
  const byKey = new Map(all.map((p) => [stateKey(p.target, p.producerName), p]));
  const superStreams: SuperStreamInspection[] = [];
  for await (const [key, value] of db.iterator({ gte: 's:', lt: 's;' })) {
    const names = parseSuperStreamKey(key);
    if (names === undefined) throw corrupt(key, 'not a super stream record key');
    const partitions = decodePartitionList(value, JSON.stringify(key.slice(0, 120))).map((partition) => {
      const state = byKey.get(stateKey(partition, names.producerName));
      byKey.delete(stateKey(partition, names.producerName));
      return { partition, state };
    });
    superStreams.push({ ...names, partitions });
  }
  return { superStreams, producers: [...byKey.values()] };
}

function stateKey(target: string, producerName: string): string {
  return `${target.length}:${target}${producerName}`;
}

/** The names in `s:<length>:<super stream><length>:<producer>`, or `undefined` for any other key. */
function parseSuperStreamKey(key: string): { superStream: string; producerName: string } | undefined {
  const m = /^s:(0|[1-9][0-9]{0,8}):/.exec(key);
  if (m === null) return undefined;
  const start = m[0].length;
  const superStream = key.slice(start, start + Number(m[1]));
  const rest = key.slice(start + Number(m[1]));
  const m2 = /^(0|[1-9][0-9]{0,8}):/.exec(rest);
  if (superStream.length !== Number(m[1]) || m2 === null) return undefined;
  const producerName = rest.slice(m2[0].length);
  return producerName.length === Number(m2[1]) ? { superStream, producerName } : undefined;
}

/**
 * Keeps what the store holds about one producer name: its producers and super stream producers,
 * the verifier scopes of that producer and the consumers that have one (`inspect --producer`).
 *
 * @throws CliError (exit code 4) when the store has nothing of that name, listing the names it has.
 */
export function selectProducer(path: string, inspection: StoreInspection, name: string): StoreInspection {
  const producers = inspection.producers.filter((p) => p.producerName === name);
  const superStreams = inspection.superStreams.filter((x) => x.producerName === name);
  const scopes = inspection.scopes.filter((x) => x.producer === name);
  if (producers.length === 0 && superStreams.length === 0 && scopes.length === 0) {
    const known = [
      ...new Set([
        ...inspection.producers.map((p) => p.producerName),
        ...inspection.superStreams.map((x) => x.producerName),
        ...inspection.scopes.map((x) => x.producer),
      ]),
    ].sort();
    throw new CliError(
      `store ${path} has no producer named ${JSON.stringify(name)} (no producer state, super stream ` +
        `record or verifier scope; ${
          known.length === 0 ? 'it has none' : `it has ${known.map((k) => JSON.stringify(k)).join(', ')}`
        })`,
      4,
    );
  }
  const consumers = new Set(scopes.map((x) => x.consumer));
  return {
    producers,
    superStreams,
    consumers: inspection.consumers.filter((c) => consumers.has(c.consumerName)),
    scopes,
  };
}

/** The `--json` output: one object, bigints as decimal strings. */
export function formatInspectionJson(path: string, inspection: StoreInspection): string {
  return toJson({ store: path, ...inspection });
}

/** The human-readable listing: one table per kind of state. */
export function formatInspection(path: string, inspection: StoreInspection): string {
  const { producers, superStreams, consumers, scopes } = inspection;
  const lines: string[] = [`store ${path}`, ''];
  lines.push(`producers: ${producers.length === 0 ? 'none' : producers.length}`);
  if (producers.length > 0) {
    lines.push(
      formatTable(
        ['target', 'producer', 'id mode', 'last id', 'reserved up to', 'outbox', 'outbox ids'],
        producers.map((p) => [
          printable(p.target),
          printable(p.producerName),
          p.idMode,
          String(p.lastId),
          String(p.reservedUpTo),
          String(p.outboxMessages),
          p.outboxFirstId === undefined ? '-' : `${p.outboxFirstId}..${p.outboxLastId}`,
        ]),
        ['left', 'left', 'left', 'right', 'right', 'right', 'left'],
      ),
    );
  }
  lines.push(...formatSuperStreams(superStreams));
  lines.push('', `verifying consumers: ${consumers.length === 0 ? 'none' : consumers.length}`);
  if (consumers.length > 0) {
    lines.push(
      formatTable(
        ['consumer', 'committed offset'],
        consumers.map((c) => [printable(c.consumerName), String(c.committedOffset)]),
        ['left', 'right'],
      ),
    );
  }
  lines.push('', `verifier scopes: ${scopes.length === 0 ? 'none' : scopes.length}`);
  if (scopes.length > 0) {
    lines.push(
      formatTable(
        ['consumer', 'tenant', 'producer', 'policy', 'highest', 'last seen'],
        scopes.map((s) => [
          printable(s.consumer),
          s.tenant.length === 0 ? '-' : printable(s.tenant),
          printable(s.producer),
          s.policy.kind === 'window' ? `window(${s.policy.size})` : 'highest',
          String(s.highest),
          s.lastSeen ?? `${s.lastSeenMs} ms`,
        ]),
        ['left', 'left', 'left', 'left', 'right', 'left'],
      ),
    );
  }
  const states = [
    ...producers,
    ...superStreams.flatMap((x) => x.partitions.flatMap((p) => (p.state === undefined ? [] : [p.state]))),
  ];
  const outbox = states.reduce((n, p) => n + p.outboxMessages, 0);
  if (outbox > 0) {
    lines.push(
      '',
      `${plural(outbox, 'message')} in the outbox: the producer re-sends them with their original ids when it opens again`,
    );
  }
  return lines.join('\n');
}

/** The super stream producers: one row per partition, with the producer's state there. */
function formatSuperStreams(superStreams: readonly SuperStreamInspection[]): string[] {
  const lines = ['', `super stream producers: ${superStreams.length === 0 ? 'none' : superStreams.length}`];
  if (superStreams.length === 0) return lines;
  const rows = superStreams.flatMap((x) =>
    x.partitions.map(({ partition, state: p }) => [
      printable(x.superStream),
      printable(x.producerName),
      printable(partition),
      ...(p === undefined
        ? ['-', '-', '-', '-', '-']
        : [
            p.idMode,
            String(p.lastId),
            String(p.reservedUpTo),
            String(p.outboxMessages),
            p.outboxFirstId === undefined ? '-' : `${p.outboxFirstId}..${p.outboxLastId}`,
          ]),
    ]),
  );
  lines.push(
    formatTable(
      [
        'super stream',
        'producer',
        'partition',
        'id mode',
        'last id',
        'reserved up to',
        'outbox',
        'outbox ids',
      ],
      rows,
      ['left', 'left', 'left', 'left', 'right', 'right', 'right', 'left'],
    ),
  );
  if (superStreams.some((x) => x.partitions.some((p) => p.state === undefined))) {
    lines.push('(a partition with "-" has no state yet: the producer never sent to it)');
  }
  return lines;
}

/** Decodes a record, naming its key when it cannot be decoded. */
function decodeRecord<T>(key: string, decode: () => T): T {
  try {
    return decode();
  } catch (err) {
    if (err instanceof DedupError) throw corrupt(key, err.message, err);
    throw err;
  }
}

function corrupt(key: string, reason: string, cause?: unknown): DedupError {
  return new DedupError(
    'DEDUP_STORE_CORRUPT',
    `store record ${JSON.stringify(key.slice(0, 120))}: ${reason}`,
    cause === undefined ? undefined : { cause },
  );
}

/** Orders by each key in turn (plain code-unit order, not the store's length-prefixed key order). */
function byKeys<T>(...keys: Array<(x: T) => string>): (a: T, b: T) => number {
  return (a, b) => {
    for (const key of keys) {
      const x = key(a);
      const y = key(b);
      if (x !== y) return x < y ? -1 : 1;
    }
    return 0;
  };
}
