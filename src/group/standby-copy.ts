/**
 * A member's warm standby copy of a partition it does not hold (docs/design.md §12.3): the keys a
 * restore of the partition would write, kept under `w:` + the key. No reader of the partition's
 * namespace sees them (the handler, `readEffect`, the core's offset, `inspect`): the copy is never
 * an effect and never the consumer's offset. A take-over adopts the copy (renames it into the
 * namespace in one batch) when it is newer than what the namespace holds, then restores from the
 * copy's read position as a member restores its own store: the same fold and checks.
 */
import { randomUUID } from 'node:crypto';
import type { Client } from 'rabbitmq-stream-js-client';
import { changelogPositionKey, decodeOffset, offsetKey } from '../store/consumer-keys.js';
import type { KeyValueDb } from '../store/store.js';
import { errorText, withTimeout } from '../transport/util.js';
import { RestoreAbandoned, RestoreStoreError } from './restore.js';
import { namespaceRanges } from './snapshot-entry.js';

/** The tag of every standby key: no other record of the store begins with it. */
const STANDBY_TAG = 'w:';

/** The member's standby ID (the choice rule's hash input), kept so that a restart chooses alike. */
const MEMBER_ID_KEY = 'w;member';

/**
 * The key under which a standby copy keeps `key` (a key of a partition's namespace, or its
 * changelog position). Injective: namespace keys are (consumer-keys.ts).
 *
 * @internal
 */
export function standbyKey(key: string): string {
  return STANDBY_TAG + key;
}

/**
 * A view of `db` in which every key is the standby copy's: a restore given this view writes,
 * reads and iterates the copy, with the namespace's own keys in its hands (their checks unchanged).
 *
 * @internal
 */
export function standbyView(db: KeyValueDb): KeyValueDb {
  return {
    get status() {
      return db.status;
    },
    open: () => db.open(),
    close: () => db.close(),
    get: (key) => db.get(standbyKey(key)),
    batch: (ops, options) =>
      db.batch(
        ops.map((op) => ({ ...op, key: standbyKey(op.key) })),
        options,
      ),
    iterator: ({ gte, lt }) => {
      const inner = db.iterator({ gte: standbyKey(gte), lt: standbyKey(lt) });
      // Through the iteration protocol only: abstract-level's own next() resolves to an entry or
      // undefined, not to an IteratorResult.
      async function* entries(): AsyncGenerator<[string, Uint8Array]> {
        for await (const [key, value] of inner) yield [key.slice(STANDBY_TAG.length), value];
      }
      return Object.assign(entries(), { close: () => inner.close() });
    },
  };
}

/**
 * The member's standby ID: read from the store, or made (a random UUID) and stored on first use.
 *
 * @internal
 */
export async function standbyMemberId(db: KeyValueDb, sync: boolean): Promise<string> {
  const raw = await db.get(MEMBER_ID_KEY);
  if (raw !== undefined) return Buffer.from(raw).toString('latin1');
  const id = randomUUID();
  await db.batch([{ type: 'put', key: MEMBER_ID_KEY, value: Buffer.from(id, 'latin1') }], { sync });
  return id;
}

/**
 * UTF-8 bytes of the adopt's one in-memory batch (the deletes of the namespace's older state, the
 * copy's keys and values) above which a copy is not adopted: today's restore runs instead.
 */
export const STANDBY_ADOPT_MAX_BYTES: number = 256 * 1024 * 1024;

/** @internal */
export interface AdoptOptions {
  readonly db: KeyValueDb;
  readonly sync: boolean;
  readonly namespace: string;
  readonly changelog: string;
  /** A connected client (the changelog's first offset is asked). */
  readonly client: Client;
  readonly timeoutMs: number;
  /** False once the activation is over: nothing is written. */
  readonly isCurrent: () => boolean;
  /** @defaultValue {@link STANDBY_ADOPT_MAX_BYTES} */
  readonly maxBytes?: number;
}

/** What {@link adoptStandbyCopy} did. @internal */
export type AdoptOutcome =
  | { readonly kind: 'adopted'; readonly offset: bigint; readonly position: bigint; readonly keys: number }
  | { readonly kind: 'none' }
  | { readonly kind: 'ignored'; readonly why: string };

/**
 * Replaces the partition's namespace with its standby copy when the copy is usable and newer: it
 * has an offset record and a read position (a restore wrote both in one batch: the state of an
 * entry of the changelog), its offset lies past the namespace's own, and its position is not before
 * the changelog's first offset (trimmed: today's restore decides, from a snapshot). Anything else
 * leaves the namespace as it is (`ignored`, with why). An adopted copy is moved: its keys are
 * deleted in the same batch (it would only take disk; a later tail begins a new copy).
 *
 * @throws RestoreAbandoned when the activation ended before the write; RestoreStoreError when the
 *   store fails.
 * @internal
 */
export async function adoptStandbyCopy(o: AdoptOptions): Promise<AdoptOutcome> {
  const { db, namespace } = o;
  const view = standbyView(db);
  const read = async <T>(op: () => Promise<T>): Promise<T> => {
    try {
      return await op();
    } catch (err) {
      throw new RestoreStoreError(err);
    }
  };
  const copyRaw = await read(() => view.get(offsetKey(namespace)));
  if (copyRaw === undefined) return { kind: 'none' };
  const positionRaw = await read(() => view.get(changelogPositionKey(namespace)));
  const ownRaw = await read(() => db.get(offsetKey(namespace)));
  if (positionRaw === undefined) return { kind: 'ignored', why: 'the copy has no read position' };
  let copy: bigint;
  let position: bigint;
  let own: bigint | undefined;
  try {
    copy = decodeOffset(copyRaw);
    position = decodeOffset(positionRaw);
    own = ownRaw === undefined ? undefined : decodeOffset(ownRaw);
  } catch (err) {
    return { kind: 'ignored', why: errorText(err) };
  }
  if (own !== undefined && own >= copy)
    return { kind: 'ignored', why: `the store is at offset ${own}, the copy at ${copy}` };
  let first: bigint;
  try {
    first = (await withTimeout(o.client.streamStatsRequest(o.changelog), o.timeoutMs, 'changelog stats'))
      .firstChunkId;
  } catch (err) {
    return { kind: 'ignored', why: `changelog stats: ${errorText(err)}` };
  }
  if (first > position)
    return { kind: 'ignored', why: `the copy reads from ${position}, the changelog starts at ${first}` };
  const ops: Array<{ type: 'put'; key: string; value: Uint8Array } | { type: 'del'; key: string }> = [];
  let bytes = 0;
  let keys = 0;
  const maxBytes = o.maxBytes ?? STANDBY_ADOPT_MAX_BYTES;
  // Every op of the one batch counts, in the UTF-8 bytes the store gets: the deletes of the
  // namespace's own older state too (it may be far larger than the copy), and the position put.
  const positionKey = changelogPositionKey(namespace);
  bytes += Buffer.byteLength(positionKey, 'utf8') * 2 + STANDBY_TAG.length + positionRaw.length;
  await read(async () => {
    for (const range of namespaceRanges(namespace)) {
      for await (const [key] of db.iterator(range)) {
        ops.push({ type: 'del', key });
        bytes += Buffer.byteLength(key, 'utf8');
        if (bytes > maxBytes) return;
      }
    }
    for (const range of namespaceRanges(namespace)) {
      for await (const [key, value] of view.iterator(range)) {
        // Moved, not copied: the copy's key goes in the same batch (§12.3, copies deleted).
        ops.push({ type: 'put', key, value }, { type: 'del', key: standbyKey(key) });
        bytes += Buffer.byteLength(key, 'utf8') * 2 + STANDBY_TAG.length + value.length;
        keys++;
        if (bytes > maxBytes) return;
      }
    }
  });
  if (bytes > maxBytes)
    return {
      kind: 'ignored',
      why: `the adopt batch (older state deleted, copy written) exceeds ${maxBytes} bytes`,
    };
  // Nothing writes the copy while a take-over holds the partition (the tail stopped): checked anyway.
  const again = await read(() => view.get(offsetKey(namespace)));
  if (again === undefined || Buffer.compare(Buffer.from(again), Buffer.from(copyRaw)) !== 0)
    return { kind: 'ignored', why: 'the copy moved while it was read' };
  ops.push(
    { type: 'put', key: positionKey, value: positionRaw },
    { type: 'del', key: standbyKey(positionKey) },
  );
  if (!o.isCurrent()) throw new RestoreAbandoned();
  await read(() => db.batch(ops, { sync: o.sync }));
  return { kind: 'adopted', offset: copy, position, keys };
}

/** UTF-8 bytes of keys per batch when a copy is deleted (a copy may be as large as the state). */
const DELETE_BATCH_BYTES = 4 * 1024 * 1024;

/**
 * Whether `db` holds anything of `namespace`'s standby copy (also what an interrupted deletion
 * left: keys without an offset record).
 *
 * @internal
 */
export async function hasStandbyCopy(db: KeyValueDb, namespace: string): Promise<boolean> {
  const view = standbyView(db);
  if ((await view.get(changelogPositionKey(namespace))) !== undefined) return true;
  for (const range of namespaceRanges(namespace)) {
    for await (const entry of view.iterator(range)) if (entry !== undefined) return true;
  }
  return false;
}

/**
 * Deletes `namespace`'s standby copy. Its offset record and read position go first, in one batch:
 * from then on the copy is never adopted (no offset record: `none`), and a tail that begins it again
 * restores it as an empty copy (restore.ts: the history replayed over what is left gives the same
 * state, and a snapshot clears the namespace before it is applied). Then its other keys, in batches
 * of at most 4 MiB of keys, while `proceed()` holds (a take-over's claim stops it between two
 * batches; a later deletion finishes it). Returns whether the copy is gone entirely. `batchBytes`:
 * tests lower it.
 *
 * @throws what the store throws.
 * @internal
 */
export async function deleteStandbyCopy(
  db: KeyValueDb,
  sync: boolean,
  namespace: string,
  proceed: () => boolean,
  batchBytes: number = DELETE_BATCH_BYTES,
): Promise<boolean> {
  const view = standbyView(db);
  if (!proceed()) return false;
  await view.batch(
    [
      { type: 'del', key: offsetKey(namespace) },
      { type: 'del', key: changelogPositionKey(namespace) },
    ],
    { sync },
  );
  let ops: Array<{ type: 'del'; key: string }> = [];
  let bytes = 0;
  for (const range of namespaceRanges(namespace)) {
    for await (const [key] of view.iterator(range)) {
      ops.push({ type: 'del', key });
      bytes += Buffer.byteLength(key, 'utf8') + STANDBY_TAG.length;
      if (bytes < batchBytes) continue;
      if (!proceed()) return false;
      await view.batch(ops, { sync });
      ops = [];
      bytes = 0;
    }
  }
  if (ops.length > 0) {
    if (!proceed()) return false;
    await view.batch(ops, { sync });
  }
  return true;
}
