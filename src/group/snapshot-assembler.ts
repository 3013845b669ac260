/**
 * Collects a changelog snapshot from the messages a restore reads (docs/design.md §12.1), and
 * says when it is complete: its marker matches its parts' count and digest. Pure: the restore
 * (restore.ts) feeds it, the hand-over model (property-tests/group-snapshot.test.ts) too.
 */
import type { Op } from '../consumer/commit-pipeline.js';
import {
  OP_OVERHEAD_BYTES,
  SNAPSHOT_MAX_BYTES,
  snapshotDigest,
  type SnapshotRecord,
} from './snapshot-entry.js';

/**
 * A snapshot that cannot be used: the restore begins again from the changelog's head.
 *
 * @internal
 */
export class SnapshotUnusable extends Error {
  constructor(why: string) {
    super(`the changelog's snapshot cannot be used: ${why}`);
    this.name = 'SnapshotUnusable';
  }
}

interface Candidate {
  readonly offset: bigint;
  next: number;
  broken: boolean;
  readonly ops: Op[];
  readonly digest: ReturnType<typeof snapshotDigest>;
  /** Bytes held (keys, values, {@link OP_OVERHEAD_BYTES} each). */
  bytes: number;
}

const opsBytes = (ops: readonly Op[]): number =>
  ops.reduce(
    (sum, op) =>
      sum + OP_OVERHEAD_BYTES + Buffer.byteLength(op.key) + (op.type === 'put' ? op.value.length : 0),
    0,
  );

/**
 * Collects snapshots from the messages a restore reads from a snapshot reference: the newest
 * snapshot whose part 0 it meets, part after part; other snapshots' messages are ignored. Complete
 * once that snapshot's marker matches its parts' count and digest; a marker that does not (a torn
 * snapshot) drops it. Entries read before the first completion are only noted: one past the
 * snapshot's offset there means the snapshot does not cover what lies before it
 * ({@link SnapshotUnusable}). After one completed, a newer snapshot that completes is returned too
 * (a zombie's older snapshot can land before the one the reference was stored for: the restore
 * takes the newest, §12.1); older or equal ones are ignored.
 *
 * @internal
 */
export class SnapshotAssembler {
  #candidate: Candidate | undefined;
  #complete: bigint | undefined;
  #highestEntry: bigint | undefined;
  /** Torn snapshots met (a marker that did not match). */
  torn = 0;
  readonly #maxBytes: number;

  /** @param maxBytes A snapshot holding more is abandoned ({@link SnapshotUnusable}). */
  constructor(maxBytes: number = SNAPSHOT_MAX_BYTES) {
    this.#maxBytes = maxBytes;
  }

  #hold(c: Candidate, ops: readonly Op[]): void {
    c.bytes += opsBytes(ops);
    if (c.bytes > this.#maxBytes)
      throw new SnapshotUnusable(
        `the snapshot of offset ${c.offset} holds more than ${this.#maxBytes} bytes (the cap of one held in memory)`,
      );
  }

  /** The offset of the newest complete snapshot returned so far. */
  get complete(): bigint | undefined {
    return this.#complete;
  }

  /** An entry covering offsets up to `lastOffset` was read (before completion it must be ≤ the snapshot's). */
  entry(lastOffset: bigint): void {
    if (this.#complete !== undefined) return;
    if (this.#highestEntry === undefined || lastOffset > this.#highestEntry) this.#highestEntry = lastOffset;
  }

  /**
   * Takes a snapshot message; returns the snapshot once it is complete.
   *
   * @throws SnapshotUnusable when the completed snapshot is older than an entry read before it, or
   *   when the snapshot assembled holds more than the cap.
   */
  take(record: SnapshotRecord): { readonly offset: bigint; readonly ops: readonly Op[] } | undefined {
    const done = this.#complete;
    if (done !== undefined && record.offset <= done) return undefined;
    const c = this.#candidate;
    if (record.kind === 'part') {
      if (record.index === 0) {
        if (c === undefined || record.offset > c.offset) {
          const digest = snapshotDigest();
          digest.update(record.body);
          const candidate = {
            offset: record.offset,
            next: 1,
            broken: false,
            ops: [...record.ops],
            digest,
            bytes: 0,
          };
          this.#candidate = candidate;
          this.#hold(candidate, record.ops);
        }
        return undefined;
      }
      if (c === undefined || c.offset !== record.offset) return undefined;
      if (record.index !== c.next) {
        c.broken = true;
        return undefined;
      }
      c.digest.update(record.body);
      this.#hold(c, record.ops);
      for (const op of record.ops) c.ops.push(op);
      c.next++;
      return undefined;
    }
    if (c === undefined || c.offset !== record.offset) return undefined;
    this.#candidate = undefined;
    if (
      c.broken ||
      record.parts !== c.next ||
      record.keys !== c.ops.length ||
      !record.digest.equals(c.digest.digest())
    ) {
      this.torn++;
      return undefined;
    }
    if (done === undefined && this.#highestEntry !== undefined && this.#highestEntry > c.offset) {
      throw new SnapshotUnusable(
        `an entry up to offset ${this.#highestEntry} lies before the snapshot of offset ${c.offset}`,
      );
    }
    // Only the offset is kept: the ops are the caller's to apply (and to let go of).
    this.#complete = c.offset;
    return { offset: c.offset, ops: c.ops };
  }
}
