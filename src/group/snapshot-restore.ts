/**
 * A restore that begins at the partition's latest referenced snapshot (docs/design.md §12.1)
 * instead of the changelog's head, for a member with nothing of the partition in its store. The
 * snapshot's parts are held until its marker says they are all there (count, digest); only then
 * are they written, and the entries after it applied as in any restore. A snapshot that is torn,
 * or that would leave a hole, is never applied half: the restore reads the whole history instead.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { changelogPositionKey, decodeOffset, offsetKey } from '../store/consumer-keys.js';
import { errorText, withTimeout } from '../transport/util.js';
import {
  RestoreAbandoned,
  RestoreStoreError,
  restorePartition,
  type RestoreOptions,
  type RestoreReport,
} from './restore.js';
import { SnapshotUnusable } from './snapshot-assembler.js';
import { namespaceRanges } from './snapshot-entry.js';

/** Where a snapshot reference is kept: the broker's offset tracking on the changelog. @internal */
export interface SnapshotReference {
  /** The reference's name (the snapshot producer's). */
  readonly reference: string;
  /** The snapshots' producer name. */
  readonly producerName: string;
}

/**
 * The changelog offset stored under `reference`, or `undefined` when none is (or the query fails:
 * the full history is always right, only slower).
 *
 * @internal
 */
export async function snapshotStart(
  client: Client,
  changelog: string,
  reference: string,
  timeoutMs: number,
): Promise<bigint | undefined> {
  try {
    return await withTimeout(client.queryOffset({ reference, stream: changelog }), timeoutMs, 'querying');
  } catch {
    return undefined;
  }
}

/**
 * Whether the changelog's retention trimmed past where the store's state of the partition was read
 * up to (§12.2): such a store can only be brought up to date from a snapshot. `false` when unsure.
 */
async function trimmedPast(o: RestoreOptions): Promise<boolean> {
  try {
    const raw = await o.db.get(changelogPositionKey(o.namespace));
    const position = raw === undefined ? 0n : decodeOffset(raw);
    const stats = await withTimeout(o.client.streamStatsRequest(o.changelog), o.stallMs, 'changelog stats');
    return stats.firstChunkId > position;
  } catch {
    return false;
  }
}

/**
 * Restores the partition, from its latest referenced snapshot when the store has nothing of it (or
 * only a state older than what the changelog's retention kept);
 * a snapshot that cannot be used (torn, or not covering what lies before it) is ignored and the
 * whole changelog read instead ({@link RestoreReport.snapshot} says which).
 *
 * @internal
 */
export async function restoreWithSnapshots(
  o: RestoreOptions,
  snapshots: SnapshotReference,
  warn: (fields: Record<string, unknown>, message: string) => void,
): Promise<RestoreReport> {
  const empty = (await o.db.get(offsetKey(o.namespace))) === undefined;
  const stale = !empty && (await trimmedPast(o));
  const from =
    empty || stale ? await snapshotStart(o.client, o.changelog, snapshots.reference, o.stallMs) : undefined;
  if (from === undefined) return restorePartition({ ...o, snapshotProducer: snapshots.producerName });
  try {
    return await restorePartition({
      ...o,
      snapshotProducer: snapshots.producerName,
      snapshotFrom: from,
      replaceStale: stale,
    });
  } catch (err) {
    if (!(err instanceof SnapshotUnusable)) throw err;
    warn(
      { changelog: o.changelog, from: from.toString(), err: errorText(err) },
      'stream-dedup: the latest changelog snapshot cannot be used; restoring from the whole changelog',
    );
    // What the attempt wrote goes: the whole changelog is read into an empty store (§12.1).
    if (empty) await clearPartition(o);
    return restorePartition({ ...o, snapshotProducer: snapshots.producerName, fromHead: true });
  }
}

/** Deletes the partition's keys from the store (after an unusable snapshot, into an empty store). */
async function clearPartition(o: RestoreOptions): Promise<void> {
  if (!o.isCurrent()) throw new RestoreAbandoned();
  try {
    const ops = [{ type: 'del' as const, key: changelogPositionKey(o.namespace) }];
    for (const range of namespaceRanges(o.namespace)) {
      for await (const [key] of o.db.iterator(range)) ops.push({ type: 'del', key });
    }
    await o.db.batch(ops, { sync: o.sync });
  } catch (err) {
    throw new RestoreStoreError(err);
  }
}
