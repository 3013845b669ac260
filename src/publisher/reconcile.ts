/**
 * Reconcile at open (docs/design.md §4.3): from what the store holds, what the broker reports and
 * the options, where the publisher starts, whether it continues above the broker (adopt), which
 * skip it declares, and which opens it refuses. A pure function: no I/O, unit-tested as a table.
 */
import { DedupError } from '../errors.js';
import type { IdMode, ProducerMeta } from '../store/codec.js';
import type { Durability } from './types.js';

/** What reconcile needs to know. */
export interface ReconcileInput {
  readonly producerName: string;
  /** The stream or queue, for messages. */
  readonly target: string;
  readonly idMode: IdMode;
  readonly durability: Durability;
  readonly onBrokerAhead: 'error' | 'adopt';
  /** The store's record of the producer; undefined for a producer never opened with this store. */
  readonly meta: ProducerMeta | undefined;
  /** How many messages the outbox holds, and the highest ID among them (0n when empty). */
  readonly outboxSize: number;
  readonly outboxLast: bigint;
  /** The broker's last publishing ID for the name; undefined where it cannot tell (AMQP 0-9-1). */
  readonly brokerLast: bigint | undefined;
}

/** Where to start, and how. */
export interface ReconcilePlan {
  /**
   * `resume`: go on from the store (re-send the outbox with its IDs first). `adopt`: the broker is
   * ahead and the options allow it: continue above it and re-send the outbox under new IDs.
   */
  readonly kind: 'resume' | 'adopt';
  /** The last ID taken: the next automatic ID is `start + 1`; explicit IDs must be above it. */
  readonly start: bigint;
  /** The store's ceiling: the highest ID it handed out or reserved (reported as `localLastId`). */
  readonly localLast: bigint;
  /** The store's reserved ceiling (0n: never reserved). */
  readonly reservedUpTo: bigint;
  /** The highest ID ever written in an outbox commit. */
  readonly outboxHigh: bigint;
  /** A skip to declare on the first new message (`x-dedup-skip-from`): its first ID. */
  readonly skipFrom: bigint | undefined;
  /**
   * Keyed records above this ID (unless in the outbox) name messages that may never have reached
   * the broker (a store written by 0.1 with keyed + reserve): forget them. Undefined: keep all.
   */
  readonly forgetKeysAbove: bigint | undefined;
}

/**
 * Refuses a store written in another ID mode: reopening it with another could reuse IDs. Runs
 * before connecting (it needs only the store).
 */
export function assertSameIdMode(meta: ProducerMeta | undefined, idMode: IdMode, producerName: string): void {
  if (meta !== undefined && meta.idMode !== idMode) {
    throw new DedupError(
      'DEDUP_ID_MODE_MISMATCH',
      `producer "${producerName}" was opened with idMode '${meta.idMode}' before; ` +
        `reopening it with '${idMode}' could reuse IDs. Use the same idMode, or another producer name.`,
    );
  }
}

/**
 * Decides where an opening publisher starts.
 *
 * @throws DedupError `DEDUP_UNSAFE_OPTIONS` (explicit IDs in reserve durability on a transport that
 * cannot report the broker's last ID), `DEDUP_SEQUENCE_REGRESSION` (the broker is ahead of the
 * store and `onBrokerAhead` is 'error', or explicit IDs in the outbox could not be re-assigned).
 */
export function reconcile(input: ReconcileInput): ReconcilePlan {
  const { meta, brokerLast, idMode, outboxLast, outboxSize } = input;
  if (idMode === 'explicit' && input.durability === 'reserve' && brokerLast === undefined) {
    // Without an outbox, explicit IDs resume after the broker's last ID: a broker that cannot tell
    // it would leave accepted messages that were never stored skipped by the source.
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      `idMode 'explicit' with durability 'reserve' needs the broker's last publishing ID to recover after a ` +
        `crash, and "${input.target}" cannot report it (AMQP 0-9-1): use durability 'outbox'`,
    );
  }
  const reservedUpTo = meta?.reservedUpTo ?? 0n;
  const localLast = meta === undefined ? 0n : maxId(meta.lastId, reservedUpTo);
  // Every ID up to it reached the broker or is in the outbox. A store of 0.1 did not record it:
  // one that never reserved IDs wrote every commit with an outbox.
  const outboxHigh = meta?.outboxHigh ?? (meta !== undefined && reservedUpTo === 0n ? meta.lastId : 0n);
  // Only a store whose last writer reserved keyed IDs (0.1 allowed keyed + reserve): its records
  // may name messages that never reached the broker. Records written with an outbox segment
  // never do, whatever the broker says (it under-reports a name it forgot).
  const forgetKeysAbove =
    idMode === 'keyed' &&
    brokerLast !== undefined &&
    brokerLast > 0n &&
    meta !== undefined &&
    reservedUpTo > 0n &&
    reservedUpTo >= meta.lastId
      ? maxId(brokerLast, outboxHigh)
      : undefined;
  const common = { localLast, reservedUpTo, outboxHigh, forgetKeysAbove };

  if (brokerLast !== undefined && brokerLast > localLast) {
    if (input.onBrokerAhead === 'error') {
      throw new DedupError(
        'DEDUP_SEQUENCE_REGRESSION',
        `the broker's last publishing ID for producer "${input.producerName}" on "${input.target}" is ${brokerLast}, ` +
          `above this store's ${localLast}. Either another process publishes under this name (names must be unique ` +
          `among live producers), or this store was lost, replaced or restored from a backup. Publishing now would ` +
          `reuse IDs the broker drops silently. Investigate, or open with onBrokerAhead: 'adopt' to continue above ` +
          `${brokerLast}${outboxSize > 0 ? ` (the ${outboxSize} outbox messages would be re-sent under new IDs)` : ''}.`,
      );
    }
    if (idMode === 'explicit' && outboxSize > 0) {
      // New IDs for them would be IDs the application's source means for other records.
      throw new DedupError(
        'DEDUP_SEQUENCE_REGRESSION',
        `the broker's last publishing ID for producer "${input.producerName}" on "${input.target}" is ${brokerLast}, ` +
          `above this store's ${localLast}, and the outbox holds ${outboxSize} messages with application-supplied ` +
          `IDs at or below it: onBrokerAhead 'adopt' cannot give them new IDs. Investigate; use a new producer name ` +
          `or a new store to start over.`,
      );
    }
    return { kind: 'adopt', start: brokerLast, skipFrom: undefined, ...common };
  }
  // Explicit IDs resume where the application's source must go on: after every ID that is in the
  // stream (the broker's last) or will be re-sent from the outbox. Not the store's last ID:
  // without an outbox (now or in an earlier life) IDs above the broker's were accepted but never
  // stored, and the application must send them again.
  const start =
    idMode === 'explicit'
      ? brokerLast !== undefined
        ? maxId(brokerLast, outboxLast, outboxHigh)
        : (meta?.lastId ?? 0n)
      : localLast;
  const skipFrom =
    idMode === 'explicit' || meta === undefined
      ? undefined
      : skipToDeclare(meta, brokerLast, outboxLast, localLast);
  return { kind: 'resume', start, skipFrom, ...common };
}

/**
 * Automatic and keyed IDs resume above the reserved ceiling: after a life in `reserve` durability
 * the rest of the block is never used. Those IDs are declared skipped on the next new message,
 * from the first one that no message in the stream or the outbox carries: above the broker's last
 * ID (or, where the broker cannot tell it, the store's last ID below every unconfirmed one) and the
 * outbox's. A skip an earlier life declared on a message that never reached the broker is declared
 * again (the store keeps it until that message is confirmed). When the store's last ID is above its
 * reserved ceiling, every ID up to it is in the stream or the outbox: no skip.
 */
function skipToDeclare(
  meta: ProducerMeta,
  brokerLast: bigint | undefined,
  outboxLast: bigint,
  ceiling: bigint,
): bigint | undefined {
  let from: bigint | undefined;
  if (meta.reservedUpTo >= meta.lastId) {
    const used = maxId(brokerLast ?? meta.lastId, outboxLast);
    if (used < ceiling) from = used + 1n;
  }
  if (
    meta.skipFrom !== undefined &&
    meta.skipFrom <= ceiling &&
    (from === undefined || meta.skipFrom < from)
  ) {
    from = meta.skipFrom;
  }
  return from;
}

/** The highest of some IDs (0n for none). */
export function maxId(...ids: bigint[]): bigint {
  return ids.reduce((a, b) => (b > a ? b : a), 0n);
}
