/**
 * `stream-dedup inspect`: what a LevelDB store holds — producers with their IDs and outbox,
 * verifying consumers with their committed offsets, and verifier scopes. Reading needs an opened
 * {@link DedupStore} (and so its lock); formatting is pure.
 */
import { DedupError } from '../errors.js';
import { decodeScopeKey } from '../identity/scope-key.js';
import { decodeSegment, type IdMode } from '../store/codec.js';
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
import { formatTable, plural, printable, toJson } from './output.js';

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

/** What {@link inspectStore} found. */
export interface StoreInspection {
  readonly producers: readonly ProducerInspection[];
  readonly consumers: readonly ConsumerInspection[];
  readonly scopes: readonly ScopeInspection[];
}

/**
 * Reads the producers, verifying consumers and verifier scopes of an opened store, each list
 * sorted by name. Writes nothing.
 *
 * The engine of `stream-dedup inspect`, whose command line is the public interface.
 *
 * @internal
 * @throws DedupError `DEDUP_STORE_CORRUPT` when a record cannot be decoded.
 */
export async function inspectStore(store: DedupStore): Promise<StoreInspection> {
  const db = store.db;
  const producers: ProducerInspection[] = [];
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
    producers.push({
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

  const consumers: ConsumerInspection[] = [];
  for await (const [key, value] of db.iterator(OFFSET_KEYS)) {
    const consumerName = consumerOfOffsetKey(key);
    if (consumerName === undefined) throw corrupt(key, 'not a consumer offset key');
    consumers.push({ consumerName, committedOffset: decodeRecord(key, () => decodeOffset(value)) });
  }

  const scopes: ScopeInspection[] = [];
  for await (const [key, value] of db.iterator(SCOPE_STATE_KEYS)) {
    const scopeKey = scopeKeyOfStateKey(key);
    const scope = decodeScopeKey(scopeKey);
    const { tracker, lastSeenMs } = decodeRecord(key, () => decodeScopeState(value, scopeKey));
    const date = new Date(lastSeenMs);
    scopes.push({
      ...scope,
      policy: tracker.spec,
      highest: tracker.highest,
      lastSeenMs,
      lastSeen: Number.isNaN(date.getTime()) ? undefined : date.toISOString(),
    });
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
  return { producers, consumers, scopes };
}

/** The `--json` output: one object, bigints as decimal strings. */
export function formatInspectionJson(path: string, inspection: StoreInspection): string {
  return toJson({ store: path, ...inspection });
}

/** The human-readable listing: one table per kind of state. */
export function formatInspection(path: string, inspection: StoreInspection): string {
  const { producers, consumers, scopes } = inspection;
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
  const outbox = producers.reduce((n, p) => n + p.outboxMessages, 0);
  if (outbox > 0) {
    lines.push(
      '',
      `${plural(outbox, 'message')} in the outbox: the producer re-sends them with their original ids when it opens again`,
    );
  }
  return lines.join('\n');
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
