/**
 * A changelog's retention policy (docs/design.md §12.2): the stream arguments the library declares
 * when it creates a changelog (`max-length-bytes`, `stream-max-segment-size-bytes`), the rule that
 * keeps a complete snapshot inside what the broker keeps (checked before any I/O), and the check of
 * an existing changelog's declared arguments (the broker never changes them after creation).
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { errorText, withTimeout } from '../transport/util.js';
import { expectOptionalObject, integerOption, outOfRange } from '../util/options.js';
import type { SnapshotPolicy } from './snapshot-writer.js';

/** A changelog's retention, resolved. @internal */
export interface ChangelogRetention {
  readonly maxLengthBytes: number;
  readonly segmentBytes: number;
}

/** The largest changelog entry (a frame): what may overshoot `snapshotEveryBytes` by one. */
const ONE_MESSAGE = 1024 * 1024;
/** The smallest `maxLengthBytes`: room for the rule below with one-message slack. */
const MIN_MAX_LENGTH_BYTES = 64 * 1024;

/**
 * Checks `changelogRetention` against the snapshot policy, before any I/O: `undefined` for none.
 *
 * The rule (§12.2): the broker deletes whole segments, oldest first, never the active one, so it
 * keeps at least `maxLengthBytes − 2·segmentBytes` (a segment may exceed its size by one chunk). A
 * restore needs the latest complete snapshot and everything after it: at most the snapshot, the
 * entries before the next one (`snapshotEveryBytes` plus one entry) and the next snapshot, written
 * while the previous one is still the latest complete. So `segmentBytes ≤ maxLengthBytes / 8` and
 * `snapshotEveryBytes ≤ maxLengthBytes / 4` are required, which leaves at least
 * about `maxLengthBytes / 4` for each of the two snapshots, less one entry's slack
 * ({@link snapshotBudget}); a snapshot larger than that is reported when written.
 *
 * @throws DedupError `DEDUP_UNSAFE_OPTIONS` for retention without snapshots by bytes, a
 *   `snapshotEveryBytes` or `segmentBytes` too large for `maxLengthBytes`, or `maxAge` (snapshots
 *   are written by volume, not by time: a quiet partition's latest snapshot would age out).
 * @throws TypeError, RangeError for a malformed option.
 * @internal
 */
export function resolveRetention(value: unknown, snapshots: SnapshotPolicy): ChangelogRetention | undefined {
  if (value === undefined) return undefined;
  expectOptionalObject(value, 'changelogRetention');
  const o = value as {
    maxLengthBytes?: unknown;
    segmentBytes?: unknown;
    maxAge?: unknown;
    maxAgeMs?: unknown;
  };
  if (o.maxAge !== undefined || o.maxAgeMs !== undefined) {
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      'changelogRetention.maxAge is not supported: snapshots are written by volume, not by time, so a ' +
        "quiet partition's latest snapshot would age out of the changelog and its next take-over fail; " +
        'use maxLengthBytes',
    );
  }
  if (o.maxLengthBytes === undefined) outOfRange('changelogRetention.maxLengthBytes', 'given', undefined);
  const maxLengthBytes = integerOption(
    o.maxLengthBytes,
    'changelogRetention.maxLengthBytes',
    0,
    MIN_MAX_LENGTH_BYTES,
  );
  const segmentBytes = integerOption(
    o.segmentBytes,
    'changelogRetention.segmentBytes',
    Math.floor(maxLengthBytes / 8),
    4096,
  );
  const refuse = (why: string): never => {
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      `changelogRetention ${JSON.stringify({ maxLengthBytes, segmentBytes })} ${why}: the library keeps a ` +
        "complete snapshot inside what retention keeps, or a take-over could not restore the partition's state",
    );
  };
  if (snapshots.everyBytes === 0)
    refuse('needs snapshots by bytes (snapshotEveryBytes > 0): entries alone do not bound the changelog');
  if (segmentBytes > maxLengthBytes / 8)
    refuse(`needs segmentBytes ≤ maxLengthBytes / 8 (${Math.floor(maxLengthBytes / 8)})`);
  if (snapshots.everyBytes > maxLengthBytes / 4)
    refuse(
      `needs snapshotEveryBytes (${snapshots.everyBytes}) ≤ maxLengthBytes / 4 (${Math.floor(maxLengthBytes / 4)})`,
    );
  return Object.freeze({ maxLengthBytes, segmentBytes });
}

/**
 * The largest snapshot the rule of {@link resolveRetention} holds: what the broker keeps at least,
 * less the entries between two snapshots and one entry's overshoot (at most a frame, 1 MiB; counted
 * as `maxLengthBytes / 16` when that is less), halved for two snapshots.
 *
 * @internal
 */
export function snapshotBudget(retention: ChangelogRetention, snapshots: SnapshotPolicy): number {
  const kept = retention.maxLengthBytes - 2 * retention.segmentBytes;
  const slack = Math.min(ONE_MESSAGE, retention.maxLengthBytes / 16);
  return Math.max(0, Math.floor((kept - snapshots.everyBytes - slack) / 2));
}

/** The stream arguments a changelog is created with (none without retention). @internal */
export function retentionArguments(
  retention: ChangelogRetention | undefined,
): Readonly<Record<string, number>> {
  if (retention === undefined) return {};
  return {
    'max-length-bytes': retention.maxLengthBytes,
    'stream-max-segment-size-bytes': retention.segmentBytes,
  };
}

/** The broker's answer to a create with other arguments than the stream's. */
const PRECONDITION_FAILED = /code 17\b|precondition/i;

/**
 * Whether existing changelog `changelog` was declared with this member's retention arguments:
 * `'same'`, `'other'` (created with other arguments, or none where this member has some: the
 * broker keeps a stream's arguments for good), or `'unknown'` (the check itself failed). Declares
 * the stream with this member's arguments, which for a stream that exists changes nothing.
 *
 * @internal
 */
export async function declaredRetention(
  client: Client,
  changelog: string,
  retention: ChangelogRetention | undefined,
  timeoutMs: number,
): Promise<'same' | 'other' | 'unknown'> {
  try {
    await withTimeout(
      client.createStream({ stream: changelog, arguments: retentionArguments(retention) }),
      timeoutMs,
      `declaring changelog "${changelog}"`,
    );
    return 'same';
  } catch (err) {
    return PRECONDITION_FAILED.test(errorText(err)) ? 'other' : 'unknown';
  }
}
