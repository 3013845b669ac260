/**
 * A stream consumer's lag and `caughtUp()` (docs/design.md §16). The stream protocol tells no
 * stream's last offset: its stats give the first offset of the last committed chunk
 * (`committed_chunk_id`). So the lag counts offsets up to that chunk's first offset — short by at
 * most the last chunk's other records — and `caughtUp()` waits for that offset to be committed,
 * then for every offset the consumer was delivered by then (the whole chunk: a chunk is delivered
 * at once).
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { integerOption } from '../util/options.js';
import { errorText, withTimeout } from './util.js';
import { STATS_TIMEOUT_MS } from './stream-resume.js';

/**
 * How far a stream consumer is behind its stream (see {@link StreamVerifyingConsumer.lag}).
 *
 * @remarks Since 0.6.0
 */
export interface ConsumerLag {
  /**
   * Offsets from the committed one to the first offset of the stream's last committed chunk: a
   * lower bound of the messages behind, short by at most the last chunk's other records. `0n`
   * for an empty stream or a consumer at (or in) the last chunk.
   */
  readonly offsets: bigint;
  /** The first offset of the stream's last committed chunk; `undefined` for an empty stream. */
  readonly lastChunkId: bigint | undefined;
  /** The consumer's committed offset when the lag was read; `undefined` before its first commit. */
  readonly committedOffset: bigint | undefined;
}

/**
 * Options of {@link StreamVerifyingConsumer.caughtUp}.
 *
 * @remarks Since 0.6.0
 */
export interface CaughtUpOptions {
  /**
   * Cancels the wait: it rejects with `DEDUP_ABORTED` (the consumer goes on).
   * @defaultValue none: only `timeoutMs` ends the wait early
   */
  readonly signal?: AbortSignal;
  /**
   * The most the wait may take, in ms; past it, it rejects with `DEDUP_ABORTED` (the consumer
   * goes on).
   * @defaultValue 60000
   */
  readonly timeoutMs?: number;
}

/** The default of {@link CaughtUpOptions.timeoutMs}. */
export const CAUGHT_UP_TIMEOUT_MS = 60_000;

/**
 * The first offset of `stream`'s last committed chunk, or `undefined` for an empty stream.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when the broker does not answer (bounded: 5 s) or refuses.
 * @internal
 */
export async function lastChunkId(client: Client, stream: string): Promise<bigint | undefined> {
  try {
    const stats = await withTimeout(client.streamStatsRequest(stream), STATS_TIMEOUT_MS, 'stream stats');
    return stats.committedChunkId < 0n || stats.lastChunkId < 0n ? undefined : stats.committedChunkId;
  } catch (err) {
    // Some brokers answer "no offset" for a stream without a chunk (stream-resume.ts).
    if (/offset/i.test(errorText(err))) return undefined;
    throw new DedupError(
      'DEDUP_BROKER_REFUSED',
      `cannot read the stats of stream "${stream}": ${errorText(err)}`,
      {
        cause: err,
      },
    );
  }
}

/**
 * The lag of a consumer that committed `committed` (`undefined`: nothing yet; it reads from
 * `firstOffset`, the stream's first offset or 0) when the last chunk starts at `last`.
 *
 * @internal
 */
export function lagOf(last: bigint | undefined, committed: bigint | undefined): ConsumerLag {
  if (last === undefined) return { offsets: 0n, lastChunkId: undefined, committedOffset: committed };
  const behind = last - (committed ?? -1n);
  return { offsets: behind > 0n ? behind : 0n, lastChunkId: last, committedOffset: committed };
}

/**
 * Checks {@link CaughtUpOptions} (before any I/O).
 *
 * @throws TypeError, RangeError "Expected <option> to be <what>, got <value>".
 * @internal
 */
export function resolveCaughtUpOptions(options: CaughtUpOptions | undefined): {
  signal: AbortSignal | undefined;
  timeoutMs: number;
} {
  if (options !== undefined && (typeof options !== 'object' || options === null)) {
    throw new TypeError(`Expected options to be an object, got ${String(options)}`);
  }
  const signal = options?.signal;
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(`Expected signal to be an AbortSignal, got ${String(signal)}`);
  }
  const timeoutMs = integerOption(options?.timeoutMs, 'timeoutMs', CAUGHT_UP_TIMEOUT_MS, 1, 2_147_483_647);
  return { signal, timeoutMs };
}

/**
 * Runs `wait` until it settles, `timeoutMs` passes or `signal` aborts; the last two reject with
 * `DEDUP_ABORTED`. No timer or listener is left behind.
 *
 * @internal
 */
export async function bounded<T>(
  wait: Promise<T>,
  what: string,
  signal: AbortSignal | undefined,
  timeoutMs: number,
): Promise<T> {
  if (signal?.aborted === true) {
    wait.catch(() => undefined);
    throw new DedupError('DEDUP_ABORTED', `${what}: aborted`, { cause: signal.reason });
  }
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  try {
    return await Promise.race([
      wait,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new DedupError('DEDUP_ABORTED', `${what}: not caught up after ${timeoutMs} ms`)),
          timeoutMs,
        );
        onAbort = () =>
          reject(new DedupError('DEDUP_ABORTED', `${what}: aborted`, { cause: signal?.reason }));
        signal?.addEventListener('abort', onAbort, { once: true });
      }),
    ]);
  } finally {
    clearTimeout(timer);
    if (onAbort !== undefined) signal?.removeEventListener('abort', onAbort);
    wait.catch(() => undefined);
  }
}
