/**
 * The consumer's offset row as the PostgreSQL store reads it: the committed offset and, since
 * 0.6.0, the identity of the stream chunk that holds it (`chunk_first_offset`, `chunk_timestamp`;
 * NULL where none was recorded: AMQP 0-9-1 consumers), which a resubscription compares
 * (consumer/chunk-identity.ts).
 */
import type { ChunkIdentity } from '../store/chunk-identity.js';
import { DedupError } from '../errors.js';

/** The columns beside `committed_offset` that hold the chunk identity, for a SELECT list. */
export const CHUNK_COLUMNS = 'chunk_first_offset, chunk_timestamp';

/** The offset row's columns as `pg` returns them (bigint as text). */
export interface StoredOffset {
  readonly committed_offset: string | null;
  readonly chunk_first_offset?: string | null;
  readonly chunk_timestamp?: string | null;
}

/** The committed offset and its chunk, as read. */
export interface OffsetRow {
  readonly offset: bigint | undefined;
  readonly chunk: ChunkIdentity | undefined;
}

/**
 * Reads an offset row (`undefined`: no row): a chunk only with both of its columns and an offset.
 *
 * @throws DedupError `DEDUP_STORE_CORRUPT` when the chunk is said to start after the offset.
 */
export function offsetRow(row: StoredOffset | undefined): OffsetRow {
  const raw = row?.committed_offset;
  const offset = raw === null || raw === undefined ? undefined : BigInt(raw);
  const first = row?.chunk_first_offset;
  const timestamp = row?.chunk_timestamp;
  if (
    offset === undefined ||
    first === null ||
    first === undefined ||
    timestamp === null ||
    timestamp === undefined
  )
    return { offset, chunk: undefined };
  const chunk = { firstOffset: BigInt(first), timestamp: BigInt(timestamp) };
  if (chunk.firstOffset > offset) {
    throw new DedupError(
      'DEDUP_STORE_CORRUPT',
      `offset row: offset ${offset} lies in a chunk said to start at ${chunk.firstOffset}`,
    );
  }
  return { offset, chunk };
}
