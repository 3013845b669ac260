/**
 * The report of `stream-dedup audit` (its data types): what `auditRecords` returns and what
 * audit-format.ts prints. Apart from audit.ts so that the formatter imports no engine (no cycle).
 */
import type { IdRange } from '../verifier/types.js';

/** One message of the stream, as `readStreamToEnd` returns it. */
export interface AuditRecord {
  readonly offset: bigint;
  /**
   * The message's body: with the caller's headers it tells an AMQP 0-9-1 re-send (the same
   * message) from another message under the same (producer, ID). Absent is read as empty.
   */
  readonly body?: Uint8Array | undefined;
  readonly applicationProperties?: Readonly<Record<string, unknown>> | undefined;
  readonly messageAnnotations?: Readonly<Record<string, unknown>> | undefined;
}

/** Options of `auditRecords`. */
export interface AuditOptions {
  /** How many examples of each problem (duplicates, gap ranges, …) the report keeps. @defaultValue 10 */
  readonly maxSamples?: number;
  /**
   * The records start mid-stream (`audit --from/--since`): a message marked
   * `x-dedup-transport: amqp091` whose ID is below its producer's first ID in the records, and not
   * seen before in them, may be a re-send of a message before the range as well as one out of
   * order. It cannot be judged and is counted in {@link AuditReport.beforeRange} only. An unmarked
   * one is judged as in a whole-stream audit (the broker deduplicates the stream protocol, so it is
   * a defect either way). @defaultValue false
   */
  readonly partial?: boolean;
}

/** A message whose (producer, ID) was already in the stream. */
export interface DuplicateSample {
  readonly publishingId: bigint;
  /** The offset of this copy. */
  readonly offset: bigint;
  /** The offset of the first copy. */
  readonly firstOffset: bigint;
}

/** A message with a new ID below the highest ID its producer had before it in the stream. */
export interface OutOfOrderSample {
  readonly publishingId: bigint;
  readonly offset: bigint;
  /** The highest ID of the producer before this message. */
  readonly previousMaxId: bigint;
}

/** What the stream says about one producer name. */
export interface ProducerAudit {
  readonly producerName: string;
  /** Messages stamped with this producer name, copies included. */
  readonly messages: number;
  /** Distinct publishing IDs. */
  readonly distinctIds: number;
  /** The lowest publishing ID seen. */
  readonly firstId: bigint;
  /** The highest publishing ID seen. */
  readonly lastId: bigint;
  /** The offsets of the producer's first and last message in the stream. */
  readonly firstOffset: bigint;
  readonly lastOffset: bigint;
  /**
   * Extra copies: messages whose ID this producer already had earlier in the stream, sent by a
   * stream-protocol publisher (whose copies the broker should have dropped): a defect.
   */
  readonly duplicates: number;
  readonly duplicateSamples: readonly DuplicateSample[];
  /**
   * Extra copies marked `x-dedup-transport: amqp091` with the first copy's body and headers: an
   * AMQP 0-9-1 publisher's outbox re-sends after a crash or reconnect. Expected (the broker does
   * not deduplicate AMQP 0-9-1; verifying consumers drop them), so they do not fail the audit.
   */
  readonly expectedCopies: number;
  readonly expectedCopySamples: readonly DuplicateSample[];
  /**
   * Copies marked `x-dedup-transport: amqp091` whose body or headers (`x-dedup-*` and the
   * broker's `x-exchange`, `x-routing-key`, `x-basic-*` aside) differ from the first copy's:
   * another message under the same (producer, ID), e.g. two AMQP 0-9-1 publishers given one
   * name, or a store restored from a backup. Verifying consumers drop it: a loss, a failure.
   *
   * @remarks Since 0.6.0
   */
  readonly conflictingCopies: number;
  readonly conflictingCopySamples: readonly DuplicateSample[];
  /**
   * IDs between {@link ProducerAudit.firstId} and {@link ProducerAudit.lastId} that never appear
   * and that no skip declares: possibly lost.
   */
  readonly missingIds: bigint;
  /** How many runs of missing IDs there are. */
  readonly gaps: number;
  /** The first runs of missing IDs, ascending. */
  readonly gapRanges: readonly IdRange[];
  /**
   * IDs that never appear but that the producer declared skipped (`x-dedup-skip-from` on its
   * first message after a restart in `reserve` durability): never used for an acknowledged message.
   */
  readonly skippedIds: bigint;
  /** The first runs of declared-skipped IDs that are missing, ascending. */
  readonly skippedRanges: readonly IdRange[];
  /**
   * Messages whose ID lies in a range that an earlier message of the stream declared skipped:
   * the declaration was wrong (or the message a late copy from before it).
   */
  readonly contradictions: number;
  readonly contradictionSamples: readonly ContradictionSample[];
  /**
   * Messages with a new ID lower than the producer's highest ID before them. A repeat of an
   * earlier ID counts as a duplicate only, never also here.
   */
  readonly outOfOrder: number;
  readonly outOfOrderSamples: readonly OutOfOrderSample[];
}

/** A message inside a range that an earlier message declared skipped. */
export interface ContradictionSample {
  readonly publishingId: bigint;
  readonly offset: bigint;
  /** The declared range, and the offset of the message that declared it. */
  readonly declared: IdRange;
  readonly declaredAt: bigint;
}

/** Messages that carry no stream-dedup identity, or a malformed one. */
export interface UnidentifiedAudit {
  /** `missing` plus `malformed`. */
  readonly count: number;
  /** Neither `x-dedup-producer` nor `x-dedup-id`. */
  readonly missing: number;
  /** One of them absent, or a value of the wrong type or form. */
  readonly malformed: number;
  readonly samples: ReadonlyArray<{ readonly offset: bigint; readonly reason: string }>;
}

/** The counts an audit sums, over the producers of a stream (or over a super stream's partitions). */
export interface AuditSums {
  readonly duplicates: number;
  /** AMQP 0-9-1 re-send copies: reported, never a failure. */
  readonly expectedCopies: number;
  /** Marked copies of another message under the same (producer, ID): a failure. Since 0.6.0 */
  readonly conflictingCopies: number;
  readonly missingIds: bigint;
  readonly gaps: number;
  readonly skippedIds: bigint;
  readonly outOfOrder: number;
  readonly contradictions: number;
}

/** What `auditRecords` found. */
export interface AuditReport extends AuditSums {
  /** Every message read. */
  readonly messages: number;
  /**
   * With `partial`: AMQP 0-9-1 messages below their producer's first ID in the range, never seen
   * in it (see {@link AuditOptions.partial}); not judged, not a failure. 0 for a whole stream.
   */
  readonly beforeRange: number;
  /** Per producer name, sorted by name. */
  readonly producers: readonly ProducerAudit[];
  readonly unidentified: UnidentifiedAudit;
  /**
   * No duplicates, no conflicting copies, no gaps, nothing out of order, no contradicted skip.
   * Declared skips, expected copies and messages without identity do not count.
   */
  readonly ok: boolean;
}
