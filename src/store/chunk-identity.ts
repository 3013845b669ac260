/**
 * Which stream a committed offset belongs to (docs/design.md §5, "A stream recreated under its
 * name"). Streams have no identity in either protocol: a stream deleted and created again under its
 * name starts at offset 0, and a consumer resuming at its committed offset + 1 would skip the new
 * stream's offsets up to there, silently. So each commit stores, beside the offset, the identity of
 * the chunk that holds it — the chunk's first offset and the timestamp its writer gave it (both in
 * the chunk header; replicas copy chunks as they are, so every node shows the same pair). On a
 * (re)subscription the consumer reads that chunk again and compares: a chunk of another timestamp,
 * or starting elsewhere, is another stream. The comparison runs before any message of the
 * subscription reaches the verifier or a handler.
 */
import { DedupError } from '../errors.js';

/**
 * A chunk as the stream protocol's chunk header names it (not exported by an entry: the type of
 * internal declarations that the published .d.ts files keep).
 */
export interface ChunkIdentity {
  /** The chunk's first offset (its chunk ID). */
  readonly firstOffset: bigint;
  /** The timestamp its writer (the stream's leader) gave it, in ms since the epoch. */
  readonly timestamp: bigint;
}

/** True when `a` and `b` name the same chunk. */
export function sameChunk(a: ChunkIdentity, b: ChunkIdentity): boolean {
  return a.firstOffset === b.firstOffset && a.timestamp === b.timestamp;
}

/** A chunk identity as text, for messages: `chunk 120 written at 2026-12-03T15:00:00.000Z`. */
export function describeChunk(chunk: ChunkIdentity): string {
  const ms = Number(chunk.timestamp);
  const when =
    Number.isSafeInteger(ms) && Math.abs(ms) <= 8.64e15 ? new Date(ms).toISOString() : 'an invalid time';
  return `chunk ${chunk.firstOffset} written at ${when} (${chunk.timestamp})`;
}

/**
 * The error that stops a consumer whose stream is not the one its committed offset came from.
 *
 * @internal
 */
export function regressionError(
  stream: string,
  consumerName: string,
  committed: bigint,
  found: string,
): DedupError {
  return new DedupError(
    'DEDUP_STREAM_REGRESSION',
    `stream "${stream}" ${found}, but consumer "${consumerName}" committed offset ${committed} of it: ` +
      'the stream was deleted and recreated (or the store belongs to another stream). Resuming would ' +
      'skip its first messages; use a new consumerName or store to read it from the start',
  );
}

/**
 * Compares the first message of a subscription with the chunk it must come from; armed per
 * subscription by the transport, consulted by the core before that message is verified.
 *
 * @internal
 */
export class ChunkExpectation {
  #expected: ChunkIdentity | undefined;
  #describe: ((found: string) => DedupError) | undefined;

  /**
   * The next message must be the first of `chunk` (`undefined`: no check, as for a store written
   * before 0.6.0 or a trimmed chunk); `refuse` builds the error from what was found.
   */
  arm(chunk: ChunkIdentity | undefined, refuse?: (found: string) => DedupError): void {
    if (chunk !== undefined && refuse === undefined)
      throw new TypeError('a chunk to expect needs its refusal');
    this.#expected = chunk;
    this.#describe = chunk === undefined ? undefined : refuse;
  }

  /** Nothing is expected any more (the subscription ended). */
  disarm(): void {
    this.#expected = undefined;
    this.#describe = undefined;
  }

  /**
   * Checks one delivered message: the first after {@link ChunkExpectation.arm} must be at the
   * expected chunk's first offset and carry its identity. Returns the error to stop with, if any.
   * A message without a chunk identity (a transport that has none) disarms without a verdict.
   */
  check(offset: bigint, chunk: ChunkIdentity | undefined): DedupError | undefined {
    const expected = this.#expected;
    if (expected === undefined) return undefined;
    const refuse = this.#describe!;
    this.disarm();
    if (chunk === undefined) return undefined;
    if (offset === expected.firstOffset && sameChunk(chunk, expected)) return undefined;
    // The expected chunk is gone and the stream now begins after it: retention trimmed it between
    // the stats query and the subscription (or the replica serving the subscription trimmed
    // earlier than the one that answered the stats). A stream recreated under the name starts at
    // offset 0 and delivers the chunk holding the offset asked for, which begins at or before it;
    // so this is the trimmed case of stream-resume.ts, resumed without a check as there.
    if (chunk.firstOffset > expected.firstOffset) return undefined;
    return refuse(
      `holds ${describeChunk(chunk)} where its ${describeChunk(expected)} was (first message read: offset ${offset})`,
    );
  }
}
