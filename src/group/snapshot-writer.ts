/**
 * Writes a partition's changelog snapshots (docs/design.md §12.1): once `snapshotEveryEntries`
 * entries or `snapshotEveryBytes` entry bytes were appended since the last one, the active member
 * writes every key of the partition's namespace, as its store holds it at offset `X`, into the
 * changelog (parts, then a marker with their count and digest: snapshot-entry.ts), and once the
 * marker is confirmed and the changelog holds no entry past `X`, stores where the snapshot begins
 * under the broker's offset tracking (reference: the snapshot producer's name) for a restore to
 * start from.
 *
 * Called between two appends of the partition (changelog-strategy.ts): no batch of the partition
 * is appended or written to the store while it runs, so the store's namespace is the state at its
 * offset record's offset, whose entry is the changelog's latest.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import type { Op } from '../consumer/commit-pipeline.js';
import { decodeOffset, offsetKey } from '../store/consumer-keys.js';
import type { KeyValueDb } from '../store/store.js';
import { queryPublisherSequence } from '../transport/stream-client-internals.js';
import { withTimeout } from '../transport/util.js';
import { entryId } from './changelog-entry.js';
import type { ChangelogWriter } from './changelog-writer.js';
import {
  encodeMarker,
  encodePart,
  MAX_PARTS,
  namespaceRanges,
  OP_OVERHEAD_BYTES,
  partBody,
  PART_OVERHEAD_BYTES,
  snapshotDigest,
  SNAPSHOT_MAX_BYTES,
  snapshotId,
} from './snapshot-entry.js';

/**
 * When snapshots are written (both 0: never).
 *
 * @internal
 */
export interface SnapshotPolicy {
  readonly everyEntries: number;
  readonly everyBytes: number;
}

/** What a snapshot write did. @internal */
export type SnapshotOutcome =
  | {
      readonly kind: 'written';
      readonly offset: bigint;
      readonly parts: number;
      readonly keys: number;
      readonly bytes: number;
      readonly from: bigint;
    }
  | { readonly kind: 'skipped'; readonly why: string }
  /** The state holds more than `maxBytes` (counted up to just past it): nothing was sent. */
  | { readonly kind: 'too-large'; readonly bytes: number; readonly maxBytes: number };

/** The largest part written, below a message's size: large enough that 10 000 small keys are one. */
const PART_BYTES = 1024 * 1024;

/** @internal */
export interface SnapshotWriterOptions {
  readonly db: KeyValueDb;
  readonly namespace: string;
  readonly changelog: string;
  /** The changelog entries' producer name (whose last ID must still be the snapshot's entry). */
  readonly entryProducer: string;
  /** The snapshots' producer name, also the offset reference they are recorded under. */
  readonly producer: string;
  readonly policy: SnapshotPolicy;
  /** Writes under {@link producer} (a `ChangelogWriter` of its own). */
  readonly writer: Pick<ChangelogWriter, 'append' | 'maxEntryBytes'>;
  readonly timeoutMs: number;
  /** A state holding more bytes is not snapshotted (tests lower it). @defaultValue {@link SNAPSHOT_MAX_BYTES} */
  readonly maxBytes?: number;
}

/** Where an appended entry sits in the partition's history (changelog-entry.ts). @internal */
export interface NotedEntry {
  /** The offset of the state it was computed on (`undefined`: the partition's first batch). */
  readonly baseOffset: bigint | undefined;
  readonly lastOffset: bigint;
}

/** @internal */
export class SnapshotWriter {
  readonly #o: SnapshotWriterOptions;
  #entries = 0;
  #bytes = 0;
  /**
   * The state's bytes as the cap counts them, at `offset`, from the last snapshot's read of every
   * key; `grown` the encoded bytes of the entries appended since, in a chain from `offset` to
   * `end` (each based on the one before). An entry encodes each put as OP_OVERHEAD_BYTES + key +
   * value, exactly what the cap counts for it, so `bytes + grown` bounds the state at `end`.
   * `undefined` until a read, and from a break in the chain (another activation's restore).
   */
  #known: { readonly bytes: number; readonly offset: bigint; grown: number; end: bigint } | undefined;

  constructor(options: SnapshotWriterOptions) {
    this.#o = options;
  }

  /** An entry of `bytes` encoded bytes was appended (`entry`: where; without it the bound is dropped). */
  noteEntry(bytes: number, entry?: NotedEntry): void {
    this.#entries++;
    this.#bytes += bytes;
    const known = this.#known;
    if (known === undefined) return;
    if (entry?.baseOffset === undefined || entry.baseOffset !== known.end) {
      this.#known = undefined;
      return;
    }
    known.grown += bytes;
    known.end = entry.lastOffset;
  }

  /**
   * Drops the running bound: the store's state of the partition changed other than through the
   * entries noted here (an activation's restore or adopted standby copy wrote another member's
   * entries, which may share a noted entry's offsets but not its bytes). The next snapshot counts
   * the state before it sends anything.
   */
  forgetBound(): void {
    this.#known = undefined;
  }

  /** The bound on the state's bytes at `offset`, when the entries since the last read chain up to it. */
  #boundAt(offset: bigint): number | undefined {
    const known = this.#known;
    return known !== undefined && known.end === offset ? known.bytes + known.grown : undefined;
  }

  /** Whether the entries or bytes since the last snapshot call for one. */
  get due(): boolean {
    const { everyEntries, everyBytes } = this.#o.policy;
    return (
      (everyEntries > 0 && this.#entries >= everyEntries) || (everyBytes > 0 && this.#bytes >= everyBytes)
    );
  }

  /**
   * Writes a snapshot of the store's state now. The counts start again whatever the outcome (a
   * snapshot that could not be written is tried again after as many more entries).
   */
  async write(client: Client, isCurrent: () => boolean): Promise<SnapshotOutcome> {
    this.#entries = 0;
    this.#bytes = 0;
    const o = this.#o;
    const rawOffset = await o.db.get(offsetKey(o.namespace));
    if (rawOffset === undefined) return { kind: 'skipped', why: 'nothing committed yet' };
    const offset = decodeOffset(rawOffset);
    // Known under the cap before anything is sent: a state found past the cap while its parts went
    // out left up to the cap's bytes of parts without a marker in the changelog each time a snapshot
    // was due. From the last read and the entries since when they bound it under the cap (one read
    // of the state), else counted first (two reads: the first snapshot, or near the cap).
    const maxBytes = o.maxBytes ?? SNAPSHOT_MAX_BYTES;
    const bound = this.#boundAt(offset);
    if (bound === undefined || bound > maxBytes) {
      const counted = await stateBytes(o.db, o.namespace, maxBytes);
      if (counted > maxBytes) return { kind: 'too-large', bytes: counted, maxBytes };
    }
    const firstId = snapshotId(offset, 0);
    if (firstId === undefined) return { kind: 'skipped', why: `offset ${offset} is beyond snapshot IDs` };
    const lastSnapshotId = await withTimeout(
      queryPublisherSequence(client, o.changelog, o.producer),
      o.timeoutMs,
      'querying the last snapshot ID',
    );
    // A snapshot of this state or a later one was begun (a crash mid-way, another member): ours
    // would be dropped part by part and mixed with it.
    if (lastSnapshotId >= firstId)
      return { kind: 'skipped', why: `a snapshot at or past offset ${offset} was begun` };
    // Every chunk there now comes before the snapshot's first part: a restore reads from here.
    const from = (await withTimeout(client.streamStatsRequest(o.changelog), o.timeoutMs, 'changelog stats'))
      .committedChunkId;
    const partBytes = Math.min(PART_BYTES, o.writer.maxEntryBytes) - PART_OVERHEAD_BYTES;
    const digest = snapshotDigest();
    let part: Op[] = [];
    let size = 0;
    let parts = 0;
    let keys = 0;
    let bytes = 0;
    let written = 0;
    const send = async (): Promise<boolean> => {
      const id = snapshotId(offset, parts);
      if (id === undefined || parts >= MAX_PARTS) return false;
      const message = encodePart(offset, parts, part);
      digest.update(partBody(message));
      bytes += message.length;
      part = [];
      size = 0;
      parts++;
      return (await o.writer.append(message, id, isCurrent)) === 'landed';
    };
    for (const range of namespaceRanges(o.namespace)) {
      for await (const [key, value] of o.db.iterator(range)) {
        const opBytes = OP_OVERHEAD_BYTES + Buffer.byteLength(key, 'utf8') + value.length;
        if (part.length > 0 && size + opBytes > partBytes && !(await send()))
          return { kind: 'skipped', why: 'another snapshot was written past this one' };
        part.push({ type: 'put', key, value });
        size += opBytes;
        written += opBytes;
        keys++;
        // Under the cap before (the store moved since: another activation's restore): a restore
        // would abandon it, the parts written so far are a snapshot without a marker.
        if (written > maxBytes) {
          this.#known = undefined;
          return { kind: 'skipped', why: `the state holds more than ${maxBytes} bytes (the snapshot cap)` };
        }
      }
    }
    // Every write of the namespace moves its offset record (a commit's batch, a restore's): the
    // same record after the reads says they saw one state (another activation's restore of this
    // store can run while this snapshot is read).
    const after = await o.db.get(offsetKey(o.namespace));
    if (after === undefined || !Buffer.from(after).equals(Buffer.from(rawOffset))) {
      this.#known = undefined;
      return { kind: 'skipped', why: 'the store moved while the snapshot was read' };
    }
    // Every key was read, of one state: its bytes are known at this offset.
    this.#known = { bytes: written, offset, grown: 0, end: offset };
    if (!isCurrent()) return { kind: 'skipped', why: 'the partition moved' };
    if (part.length > 0 && !(await send()))
      return { kind: 'skipped', why: 'another snapshot was written past this one' };
    const markerId = snapshotId(offset, parts);
    if (markerId === undefined) return { kind: 'skipped', why: 'too many parts' };
    const marker = await o.writer.append(
      encodeMarker(offset, parts, keys, digest.digest()),
      markerId,
      isCurrent,
    );
    if (marker !== 'landed') return { kind: 'skipped', why: 'another snapshot was written past this one' };
    // An entry past the snapshot's state may lie before its parts: a restore from `from` would miss it.
    const lastEntry = await withTimeout(
      queryPublisherSequence(client, o.changelog, o.entryProducer),
      o.timeoutMs,
      'querying the last entry ID',
    );
    if (lastEntry !== entryId(offset))
      return {
        kind: 'skipped',
        why: `the changelog's last entry ID is ${lastEntry}, not the snapshot's ${entryId(offset)}`,
      };
    if (!isCurrent()) return { kind: 'skipped', why: 'the partition moved' };
    await withTimeout(
      storeReference(client, o.producer, o.changelog, from),
      o.timeoutMs,
      'storing the snapshot reference',
    );
    return { kind: 'written', offset, parts, keys, bytes, from };
  }
}

/**
 * The bytes a snapshot of `namespace` would hold (keys, values and {@link OP_OVERHEAD_BYTES} a key,
 * as the cap counts them), read up to the first key past `maxBytes`: a local read of the store, no
 * I/O to the broker.
 */
async function stateBytes(db: KeyValueDb, namespace: string, maxBytes: number): Promise<number> {
  let bytes = 0;
  for (const range of namespaceRanges(namespace)) {
    for await (const [key, value] of db.iterator(range)) {
      bytes += OP_OVERHEAD_BYTES + Buffer.byteLength(key, 'utf8') + value.length;
      if (bytes > maxBytes) return bytes;
    }
  }
  return bytes;
}

/**
 * Stores `offset` under `reference` on `stream` (the broker's offset tracking), through the
 * client's locator connection: the 1.0 client offers it only on a consumer or a connection.
 */
function storeReference(client: Client, reference: string, stream: string, offset: bigint): Promise<void> {
  const locator = (client as unknown as { locatorConnection?: { storeOffset?: unknown } }).locatorConnection;
  if (typeof locator?.storeOffset !== 'function')
    return Promise.reject(new Error("this client's locator connection cannot store an offset"));
  return (
    locator.storeOffset as (p: { reference: string; stream: string; offsetValue: bigint }) => Promise<void>
  ).call(locator, { reference, stream, offsetValue: offset });
}
