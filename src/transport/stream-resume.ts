/**
 * Where a stream consumer with a committed offset subscribes again, and what it must find there
 * (consumer/chunk-identity.ts): the recreated-stream check of the stream consumer and of a
 * consumer group's partitions. One stats query (bounded), then:
 *
 * - an empty stream: recreated (retention never empties a stream) → `DEDUP_STREAM_REGRESSION`;
 * - no chunk identity stored (a store of an older version): at committed + 1, no check;
 * - the stream's last chunk starts before the stored chunk: the node that answered is behind (a
 *   replica catching up after a partition: seen in the nemesis test, 22494 against a stored
 *   23167), or the stream was recreated and is still shorter. Not refused at once: the
 *   subscription waits at the stored chunk's first offset with the check armed, so the chunk that
 *   arrives there — the same one once the replica caught up, another one when the recreated stream
 *   grows past it — decides;
 * - the stream's first chunk starts after the stored chunk: retention trimmed it, legitimately;
 *   nothing is left to compare → at committed + 1, no check (a recreated stream that retention
 *   trimmed past that chunk too goes undetected: documented);
 * - otherwise: at the stored chunk's first offset, and the first message delivered must carry
 *   that chunk's identity (one chunk is read again; its offsets up to the committed one are
 *   redeliveries the core skips).
 *
 * A stats query that fails otherwise or times out proves nothing: at committed + 1, no check.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import type { ChunkIdentity } from '../store/chunk-identity.js';
import type { DedupError } from '../errors.js';
import { decodeOffsetRecord, offsetKey } from '../store/consumer-keys.js';
import type { KeyValueDb } from '../store/store.js';
import { errorText, withTimeout } from './util.js';

/** How long the stats query may take. */
export const STATS_TIMEOUT_MS = 5_000;

/** Where to subscribe, and the chunk the first delivered message must come from. */
export interface ResumePlan {
  readonly offset: bigint;
  /** `undefined`: no check. */
  readonly expect: ChunkIdentity | undefined;
}

/**
 * Plans the resubscription of a consumer that committed `committed` (in `chunk`, when stored) of
 * `stream`.
 *
 * @throws DedupError what `refuse` builds (`DEDUP_STREAM_REGRESSION`) from a description of what
 *   the stream holds, when it cannot be the stream `committed` came from.
 * @internal
 */
export async function planResume(
  client: Client,
  stream: string,
  committed: bigint,
  chunk: ChunkIdentity | undefined,
  refuse: (found: string) => DedupError,
): Promise<ResumePlan> {
  const unchecked: ResumePlan = { offset: committed + 1n, expect: undefined };
  let stats: { firstChunkId: bigint; lastChunkId: bigint } | 'empty' | undefined;
  try {
    stats = await withTimeout(client.streamStatsRequest(stream), STATS_TIMEOUT_MS, 'stream stats');
    if (stats.lastChunkId < 0n) stats = 'empty';
  } catch (err) {
    // Some brokers answer "no offset" for a stream without a chunk, as readStreamToEnd knows.
    if (/offset/i.test(errorText(err))) stats = 'empty';
  }
  if (stats === 'empty') throw refuse('is empty');
  if (stats === undefined || chunk === undefined) return unchecked;
  // A last chunk before the stored one: a replica behind, or a recreated stream still shorter. The
  // subscription at the stored chunk waits for it; the check decides when a chunk arrives there.
  if (stats.lastChunkId < chunk.firstOffset) return { offset: chunk.firstOffset, expect: chunk };
  // Trimmed by retention: nothing to compare with.
  if (stats.firstChunkId > chunk.firstOffset) return unchecked;
  return { offset: chunk.firstOffset, expect: chunk };
}

/**
 * The chunk identity stored with consumer `consumerName`'s offset in `db` (a consumer group's
 * partition reads it after its restore, before its core opens), if any.
 *
 * @throws DedupError `DEDUP_STORE_CORRUPT` for an offset record that does not decode.
 * @internal
 */
export async function storedChunk(db: KeyValueDb, consumerName: string): Promise<ChunkIdentity | undefined> {
  const raw = await db.get(offsetKey(consumerName));
  return raw === undefined ? undefined : decodeOffsetRecord(raw).chunk;
}
