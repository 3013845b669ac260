/**
 * Restores a partition's state in the member's store from its changelog (docs/design.md §12):
 * before a member applies anything of a partition it just became active for, it reads the
 * changelog from where it last read up to the changelog's end and applies every entry past its
 * own state. Entries at or below the store's offset are skipped (the store has them, from its own
 * commits or an earlier restore); an entry whose base lies past the store's offset would leave a
 * hole and stops the restore, as does a changelog that lost its head to a retention policy.
 */
import { Offset, type Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { holdsIdentity, parseIdentity } from '../identity/headers.js';
import {
  changelogPositionKey,
  decodeOffset,
  encodeOffset,
  isConsumerKey,
  offsetKey,
} from '../store/consumer-keys.js';
import type { KeyValueDb } from '../store/store.js';
import type { Op } from '../consumer/commit-pipeline.js';
import { creditPolicyOf, type CreditRequest, type StreamMessage } from '../transport/stream-delivery.js';
import {
  consumerCloseEvents,
  listenDecodeErrors,
  queryPublisherSequence,
} from '../transport/stream-client-internals.js';
import { errorText, withTimeout } from '../transport/util.js';
import { decodeRecord, entryId, GENESIS_ID } from './changelog-entry.js';
import { ownIdentity } from './changelog-identity.js';
import { ChunkOrder } from './chunk-order.js';
import { SnapshotAssembler, SnapshotUnusable } from './snapshot-assembler.js';
import { decodeSnapshotRecord, namespaceRanges, offsetOfSnapshotId } from './snapshot-entry.js';

/** @internal */
export interface RestoreOptions {
  readonly db: KeyValueDb;
  readonly sync: boolean;
  /** The partition's namespace in the store (the core's consumer name). */
  readonly namespace: string;
  readonly changelog: string;
  /** The changelog's producer name. */
  readonly producerName: string;
  /** This member's settings (`groupSettings` of changelog-identity.ts): a record written under others is refused. */
  readonly settings?: string;
  /** A connected client; the restore declares one consumer on it and removes it. */
  readonly client: Client;
  /** How long the restore may wait without a new entry before asking the broker for the end again. */
  readonly stallMs: number;
  /** How long the whole restore may take. */
  readonly timeoutMs: number;
  /** False once the partition moved on: the restore stops before its next write. */
  readonly isCurrent: () => boolean;
  /** The read-ahead's bound in bytes (tests lower it). @defaultValue {@link READ_AHEAD_BYTES} */
  readonly readAheadBytes?: number;
  /** The bytes at which a store write is made early (tests lower it). @defaultValue {@link BYTES_PER_WRITE} */
  readonly bytesPerWrite?: number;
  /** The producer name of the group's snapshots (§12.1): their messages are skipped, or assembled. */
  readonly snapshotProducer?: string;
  /**
   * Where the latest snapshot's reference points (snapshot-restore.ts): a store with nothing of the
   * partition reads from there, applies the snapshot once complete, then the entries after it.
   */
  readonly snapshotFrom?: bigint;
  /** Read from the changelog's head whatever the store's position (after an unusable snapshot). */
  readonly fromHead?: boolean;
  /**
   * The store's state of the partition lies before what retention kept (§12.2): restored from the
   * snapshot as an empty store would be, the snapshot replacing it once complete.
   */
  readonly replaceStale?: boolean;
  /** A snapshot holding more bytes is abandoned (tests lower it). @defaultValue `SNAPSHOT_MAX_BYTES` (snapshot-entry.ts, 256 MiB) */
  readonly snapshotMaxBytes?: number;
}

/**
 * What a restore did.
 *
 * @internal
 */
export interface RestoreReport {
  /** The partition's offset in the store afterwards (`undefined`: nothing committed yet). */
  readonly offset: bigint | undefined;
  /**
   * Where the partition's input begins, from the genesis, when the restore read it (it does when
   * the store has nothing of the partition); `undefined` for a changelog without one yet.
   */
  readonly start: bigint | undefined;
  /** Changelog entries read, and of them applied (the others the store had). */
  readonly read: number;
  readonly applied: number;
  /** The changelog's last ID when the restore began (0n: empty). */
  readonly changelogLastId: bigint;
  /** The offset of the snapshot the restore began from, if it did. */
  readonly snapshot?: bigint;
}

/**
 * The activation the restore served is over: it stopped before writing anything more.
 *
 * @internal
 */
export class RestoreAbandoned extends Error {
  constructor() {
    super('the partition moved on during its restore');
    this.name = 'RestoreAbandoned';
  }
}

/**
 * A read or write of the member's store failed during a restore: the member stops with `cause`,
 * as it does when a commit's write fails (a take-over tried again would fail the same way).
 *
 * @internal
 */
export class RestoreStoreError extends Error {
  constructor(cause: unknown) {
    super(`restoring a partition: the store failed: ${errorText(cause)}`, { cause });
    this.name = 'RestoreStoreError';
  }
}

async function stored<T>(op: () => Promise<T>): Promise<T> {
  try {
    return await op();
  } catch (err) {
    throw new RestoreStoreError(err);
  }
}

/** Entries per LevelDB batch while restoring, and the bytes at which a batch is written early. */
const ENTRIES_PER_WRITE = 512;
/** @internal */
export const BYTES_PER_WRITE = 4 * 1024 * 1024;

/** Entries read ahead of the writes above which no more chunks are asked for, and below which they are again. */
const QUEUE_HIGH = 4_096;
const QUEUE_LOW = 1_024;

/**
 * Bytes read ahead of the writes (entries' contents) at or above which no more chunks are asked
 * for; they are again below a quarter of it. Entries are bounded by the frame size, not small: 4 096
 * entries near a 1 MiB frame held 4 GiB when the disk was slower than the network. The chunks
 * already asked for still come (at most {@link INITIAL_CREDITS}), so the read-ahead holds at most
 * this plus 32 chunks, and the write being prepared {@link BYTES_PER_WRITE} more.
 *
 * @internal
 */
export const READ_AHEAD_BYTES = 32 * 1024 * 1024;

/**
 * Chunks in flight: each completed chunk asks for one more (unless the queue is full). A member
 * writes one changelog entry per confirm, so a changelog holds about one entry per chunk, and one
 * chunk in flight cost the restore a round trip per entry (measured, 100 000 entries: 37.9 s).
 * Needs Nagle's algorithm off on the connection (`guardHeartbeats`), and `ChunkOrder`: chunks in
 * flight together reach the handler interleaved.
 */
export const INITIAL_CREDITS = 32;

/** Stream protocol response code 2: the stream does not exist. */
const DOES_NOT_EXIST = /code 2\b|does not exist/i;

/**
 * Reads the changelog up to its end and applies what the store lacks.
 *
 * @throws DedupError `DEDUP_CHANGELOG_INVALID` (an entry that does not decode, a hole, a lost head),
 *   `DEDUP_BROKER_UNREACHABLE` when the end is not reached within `timeoutMs`.
 *
 * @internal
 */
export async function restorePartition(o: RestoreOptions): Promise<RestoreReport> {
  const { db, namespace } = o;
  const raw = await stored(() => db.get(offsetKey(namespace)));
  let local = raw === undefined || o.replaceStale === true ? undefined : decodeOffset(raw);
  const rawPosition = await stored(() => db.get(changelogPositionKey(namespace)));
  // With nothing of the partition in the store, from the genesis on: it says where input begins.
  const snapshotFrom = local === undefined && o.snapshotProducer !== undefined ? o.snapshotFrom : undefined;
  const fromSnapshot = snapshotFrom !== undefined;
  const position =
    o.fromHead === true || rawPosition === undefined || local === undefined
      ? (snapshotFrom ?? 0n)
      : decodeOffset(rawPosition);
  // A changelog that does not exist is believed only by a member that has nothing of the partition:
  // a node back from a network partition can say it of a stream that exists.
  const askLastId = (missingMeansEmpty: boolean): Promise<bigint> =>
    changelogLastId(o.client, o.changelog, o.producerName, o.stallMs, missingMeansEmpty);
  const lastId = await askLastId(local === undefined && position === 0n);
  const have = local === undefined ? 0n : entryId(local);
  if (lastId <= have)
    return { offset: local, start: undefined, read: 0, applied: 0, changelogLastId: lastId };
  // The snapshots written so far: a restore from a reference reads until its snapshot is complete.
  const snapshots =
    fromSnapshot && o.snapshotProducer !== undefined
      ? {
          assembler: new SnapshotAssembler(o.snapshotMaxBytes),
          lastId: await withTimeout(
            queryPublisherSequence(o.client, o.changelog, o.snapshotProducer),
            o.stallMs,
            'querying the last snapshot ID',
          ),
          seenId: 0n,
          at: undefined as bigint | undefined,
          // Every snapshot message up to `lastId` was read (the newest complete one is applied).
          done: false,
        }
      : undefined;
  // While snapshots may still come, the store gets neither an offset record nor a read position:
  // a newer complete snapshot may replace what is applied, and a position past entries the store
  // never applied would leave it unable to restore again (§12.1).
  const snapshotsOpen = (): boolean => snapshots !== undefined && !snapshots.done;
  // The offset record withheld meanwhile (the snapshot's, then the entries' after it): written as
  // it is (it may carry its chunk's identity) once the snapshots are read.
  let withheldOffset: Op | undefined;

  const stats = await withTimeout(o.client.streamStatsRequest(o.changelog), o.stallMs, 'changelog stats');
  if (stats.firstChunkId > position && fromSnapshot) {
    throw new DedupError(
      'DEDUP_CHANGELOG_INVALID',
      `changelog "${o.changelog}" starts at offset ${stats.firstChunkId}: its latest complete snapshot (referenced ` +
        `at offset ${position}) was trimmed away by the changelog's retention; not restoring from a partial history`,
    );
  }
  if (stats.firstChunkId > position) {
    throw new DedupError(
      'DEDUP_CHANGELOG_INVALID',
      `changelog "${o.changelog}" starts at offset ${stats.firstChunkId}, past offset ${position} where this ` +
        'member must read from: its first entries are gone (a retention policy on the changelog?)',
    );
  }

  const owns = (key: string): boolean => isConsumerKey(namespace, key);
  let read = 0;
  let applied = 0;
  let start: bigint | undefined;
  let lastSeenId = 0n;
  // Whether a record of this member's settings came yet: one of other settings after it is refused.
  const settingsSeen = { ownSettings: false };
  let target = lastId;
  let ops: Op[] = [];
  let bytes = 0;
  let entriesInWrite = 0;
  let nextPosition = position;
  let failure: Error | undefined;
  // Entries read and not yet applied, in stream order; the credit is held while there are many,
  // or while they are large.
  const queue = new ChunkOrder();
  const readAheadBytes = o.readAheadBytes ?? READ_AHEAD_BYTES;
  // Credits held back while the queue is full: every chunk completed then holds one, and all are
  // given back at once (one held grant would have left a single chunk in flight from then on).
  let heldCredits = 0;
  let requestHeld: CreditRequest | undefined;
  const grantHeld = (): void => {
    const request = requestHeld;
    const credits = heldCredits;
    requestHeld = undefined;
    heldCredits = 0;
    if (request !== undefined && credits > 0) void request(credits).catch(() => undefined);
  };
  let wake: (() => void) | undefined;
  const notify = (): void => {
    const w = wake;
    wake = undefined;
    w?.();
  };

  const flush = async (): Promise<void> => {
    if (entriesInWrite === 0 && nextPosition === position) return;
    // A restore of an activation that is over writes nothing more (a newer one may be running).
    if (!o.isCurrent()) throw new RestoreAbandoned();
    if (!snapshotsOpen())
      ops.push({ type: 'put', key: changelogPositionKey(namespace), value: encodeOffset(nextPosition) });
    await stored(() => db.batch(ops, { sync: o.sync }));
    ops = [];
    bytes = 0;
    entriesInWrite = 0;
  };

  // Per subscription: the client may carry other reads before or after this one (a standby tail).
  const unlisten = listenDecodeErrors(o.client, (error) => {
    failure ??= new DedupError(
      'DEDUP_CHANGELOG_INVALID',
      `cannot read changelog "${o.changelog}": ${error.message}`,
      { cause: error },
    );
    notify();
  });
  let consumer;
  try {
    consumer = await withTimeout(
      o.client.declareConsumer(
        {
          stream: o.changelog,
          offset: Offset.offset(position),
          creditPolicy: creditPolicyOf(
            (request) => {
              if (queue.chunkCompleted()) notify();
              if (queue.waiting < QUEUE_HIGH && queue.waitingBytes < readAheadBytes)
                void request(1).catch(() => undefined);
              else {
                requestHeld = request;
                heldCredits++;
              }
              return Promise.resolve();
            },
            INITIAL_CREDITS,
            () => queue.chunkStarted(),
          ),
          connectionClosedListener: () => {
            failure ??= new Error(`the connection reading changelog "${o.changelog}" closed`);
            notify();
          },
        },
        (message) => queue.push(message),
      ),
      o.stallMs,
      `subscribing to changelog "${o.changelog}"`,
    );
  } catch (err) {
    unlisten();
    throw err;
  }
  // As for the stream consumer: the client's own reaction to a leader change rejects unhandled.
  consumerCloseEvents(consumer)?.removeAllListeners(`close_consumer_${consumer.extendedId}`);
  const deadline = performance.now() + o.timeoutMs;
  try {
    const reached = (): boolean => lastSeenId >= target || (local !== undefined && entryId(local) >= target);
    while (!reached() || snapshotsOpen()) {
      if (snapshots !== undefined && !snapshots.done && snapshots.seenId >= snapshots.lastId) {
        if (snapshots.at === undefined || local === undefined)
          throw new SnapshotUnusable(
            `no complete snapshot after offset ${position} (${snapshots.assembler.torn} torn)`,
          );
        // The newest snapshot is applied, and the entries after it: the store's state is whole.
        snapshots.done = true;
        ops.push(withheldOffset ?? { type: 'put', key: offsetKey(namespace), value: encodeOffset(local) });
        withheldOffset = undefined;
        entriesInWrite++;
        await flush();
        continue;
      }
      if (failure !== undefined) throw failure;
      if (!o.isCurrent()) throw new RestoreAbandoned();
      const message = queue.next();
      if (heldCredits > 0 && queue.waiting < QUEUE_LOW && queue.waitingBytes < readAheadBytes / 4)
        grantHeld();
      if (message === undefined) {
        if (performance.now() >= deadline) {
          throw new DedupError(
            'DEDUP_BROKER_UNREACHABLE',
            `restoring from changelog "${o.changelog}": reached entry ${lastSeenId} of ${target} within ${o.timeoutMs} ms`,
          );
        }
        const arrived = await new Promise<boolean>((resolve) => {
          const timer = setTimeout(() => resolve(false), o.stallMs);
          wake = () => {
            clearTimeout(timer);
            resolve(true);
          };
        });
        if (!arrived && queue.openChunks > 0 && !snapshotsOpen()) {
          // A chunk begun and never finished holds everything back: the client failed mid-chunk.
          // The take-over is tried again (a new subscription) rather than waiting out timeoutMs.
          throw new Error(
            `reading changelog "${o.changelog}": a chunk was begun and not finished within ${o.stallMs} ms`,
          );
        }
        // Quiet: the last ID may have belonged to an entry a leader lost before replicating it.
        if (!arrived) target = await askLastId(false);
        // The same for the snapshot producer's last ID (an entry a leader lost before replicating it).
        if (
          !arrived &&
          snapshots !== undefined &&
          snapshots.at === undefined &&
          o.snapshotProducer !== undefined
        )
          snapshots.lastId = await changelogLastId(
            o.client,
            o.changelog,
            o.snapshotProducer,
            o.stallMs,
            false,
          );
        // Quiet with snapshot messages still owed: they lie before the reference (a reference not
        // stored for a snapshot after it), or a chunk never finished. Not waited for: unusable.
        if (!arrived && snapshots !== undefined && !snapshots.done && snapshots.seenId < snapshots.lastId)
          throw new SnapshotUnusable(
            `the read went quiet at snapshot ID ${snapshots.seenId} of ${snapshots.lastId} after offset ${position}`,
          );
        continue;
      }
      const offset = message.offset;
      if (offset === undefined) throw new Error('the stream client delivered a message without an offset');
      const where = `at offset ${offset} of "${o.changelog}"`;
      if (o.snapshotProducer !== undefined && producerOf(message) === o.snapshotProducer) {
        const id = ownIdentity(message, o.snapshotProducer, where, o.settings, settingsSeen).publishingId;
        read++;
        nextPosition = offset + 1n;
        if (snapshots === undefined || snapshots.done) continue;
        snapshots.seenId = id;
        let record;
        try {
          record = decodeSnapshotRecord(message.content, owns, where);
        } catch (err) {
          // A newer version's or a corrupt snapshot: the changelog's entries still decide.
          throw new SnapshotUnusable(errorText(err));
        }
        if (offsetOfSnapshotId(id) !== record.offset)
          throw new SnapshotUnusable(
            `the snapshot message ${where} has ID ${id}, not of offset ${record.offset}`,
          );
        const complete = snapshots.assembler.take(record);
        // A complete snapshot no newer than the state applied (entries after an older one) adds nothing.
        if (complete === undefined || (local !== undefined && complete.offset <= local)) continue;
        snapshots.at = complete.offset;
        // What is pending is written first, so that the clearing below sees it.
        await flush();
        // Whatever a crash, an older snapshot or the entries after it left goes first.
        for (const range of namespaceRanges(namespace)) {
          for await (const [key] of db.iterator(range)) ops.push({ type: 'del', key });
        }
        const offsetRecord = offsetKey(namespace);
        for (const op of complete.ops) {
          if (op.key === offsetRecord) continue;
          ops.push(op);
          bytes += op.key.length + (op.type === 'put' ? op.value.length : 0);
          if (bytes >= (o.bytesPerWrite ?? BYTES_PER_WRITE)) await flush();
        }
        const stored = complete.ops.find((op) => op.key === offsetRecord);
        if (stored === undefined || stored.type !== 'put' || decodeOffset(stored.value) !== complete.offset)
          throw new SnapshotUnusable(
            `the snapshot of offset ${complete.offset} holds no offset record of it`,
          );
        // The offset record comes once every snapshot up to the last ID was read (above).
        withheldOffset = stored;
        entriesInWrite++;
        local = complete.offset;
        applied++;
        await flush();
        continue;
      }
      const identity = ownIdentity(message, o.producerName, where, o.settings, settingsSeen);
      if (identity.publishingId <= lastSeenId) {
        throw new DedupError(
          'DEDUP_CHANGELOG_INVALID',
          `changelog entry ${where} has ID ${identity.publishingId}, not above the entry before it (${lastSeenId})`,
        );
      }
      const record = decodeRecord(message.content, owns, where);
      if ((record.kind === 'genesis') !== (identity.publishingId === GENESIS_ID)) {
        throw new DedupError(
          'DEDUP_CHANGELOG_INVALID',
          `changelog ${record.kind} ${where} has ID ${identity.publishingId}: only the genesis has ID ${GENESIS_ID}`,
        );
      }
      if (record.kind === 'genesis') {
        lastSeenId = GENESIS_ID;
        start = record.start;
        read++;
        nextPosition = offset + 1n;
        continue;
      }
      if (position === 0n && lastSeenId === 0n) {
        throw new DedupError(
          'DEDUP_CHANGELOG_INVALID',
          `changelog "${o.changelog}" begins with an entry, not its genesis (${where})`,
        );
      }
      const entry = record;
      if (entryId(entry.lastOffset) !== identity.publishingId) {
        throw new DedupError(
          'DEDUP_CHANGELOG_INVALID',
          `changelog entry ${where} covers offsets up to ${entry.lastOffset} but has ID ${identity.publishingId}`,
        );
      }
      lastSeenId = identity.publishingId;
      read++;
      nextPosition = offset + 1n;
      if (snapshots !== undefined && snapshots.at === undefined) {
        // Before the snapshot is complete, entries are only noted: they must be older than it.
        snapshots.assembler.entry(entry.lastOffset);
      } else if (local === undefined || entry.lastOffset > local) {
        if (entry.baseOffset !== undefined && (local === undefined || entry.baseOffset > local)) {
          if (snapshots !== undefined)
            throw new SnapshotUnusable(
              `entry ${where} was computed on offset ${entry.baseOffset}, past the snapshot's`,
            );
          throw new DedupError(
            'DEDUP_CHANGELOG_INVALID',
            `changelog entry ${where} was computed on offset ${entry.baseOffset}, past this member's ` +
              `state (${local === undefined ? 'empty' : `offset ${local}`}): the entries between are missing`,
          );
        }
        for (const op of entry.ops) {
          if (snapshotsOpen() && op.key === offsetKey(namespace)) {
            withheldOffset = op;
            continue;
          }
          ops.push(op);
          bytes += op.key.length + (op.type === 'put' ? op.value.length : 0);
        }
        local = entry.lastOffset;
        applied++;
      }
      entriesInWrite++;
      if (entriesInWrite >= ENTRIES_PER_WRITE || bytes >= (o.bytesPerWrite ?? BYTES_PER_WRITE)) await flush();
    }
    await flush();
  } finally {
    await withTimeout(o.client.closeConsumer(consumer.extendedId), 5_000, 'closing').catch(() => undefined);
    unlisten();
  }
  return { offset: local, start, read, applied, changelogLastId: lastId, snapshot: snapshots?.at };
}

/** The producer name a changelog message says it was written under (`undefined`: none readable). */
function producerOf(message: Pick<StreamMessage, 'applicationProperties'>): string | undefined {
  const headers = message.applicationProperties;
  if (!holdsIdentity(headers)) return undefined;
  const identity = parseIdentity(headers);
  return typeof identity === 'string' ? undefined : identity.producerName;
}

/**
 * The broker says the changelog does not exist, to a member that holds state from it: not believed
 * at once (a node back from a network partition can say it of a stream that exists); the member
 * takes the partition over again, and believes it once it lasted (see GroupPartition).
 *
 * @internal
 */
export class ChangelogMissing extends DedupError {
  constructor(changelog: string, cause: unknown) {
    super(
      'DEDUP_BROKER_UNREACHABLE',
      `the broker says changelog "${changelog}" does not exist, but this member holds state from it: not believed`,
      { cause },
    );
  }
}

/**
 * The changelog's last ID (0n for a changelog not yet written, or, when `missingMeansEmpty`, not
 * yet created; otherwise "does not exist" is an error the activation is retried after).
 *
 * @internal
 */
export async function changelogLastId(
  client: Client,
  changelog: string,
  producerName: string,
  timeoutMs: number,
  missingMeansEmpty: boolean,
): Promise<bigint> {
  try {
    return await withTimeout(
      queryPublisherSequence(client, changelog, producerName),
      timeoutMs,
      `querying the last ID of changelog "${changelog}"`,
    );
  } catch (err) {
    if (!DOES_NOT_EXIST.test(errorText(err))) throw err;
    if (missingMeansEmpty) return 0n;
    throw new ChangelogMissing(changelog, err);
  }
}

/**
 * The start offset in the changelog's genesis (its first message), read after a member's own
 * genesis was confirmed with the broker's last ID 1: the broker kept one of the genesis writes,
 * and only its content says whose.
 *
 * @throws DedupError `DEDUP_CHANGELOG_INVALID` when the first message is not a genesis;
 *   `DEDUP_BROKER_UNREACHABLE` when it does not arrive within `timeoutMs`.
 *
 * @internal
 */
export async function readGenesis(
  client: Client,
  changelog: string,
  producerName: string,
  timeoutMs: number,
  settings?: string,
): Promise<bigint> {
  const { message, failure } = await firstMessage(client, changelog, undefined, timeoutMs);
  if (message === undefined) {
    const cause = failure ?? new Error(`nothing arrived within ${timeoutMs} ms`);
    throw new DedupError(
      'DEDUP_BROKER_UNREACHABLE',
      `reading the genesis of changelog "${changelog}": ${errorText(cause)}`,
      { cause },
    );
  }
  const where = `at the head of "${changelog}"`;
  // The genesis comes before everything: a group that changed its settings since is not refused.
  const identity = ownIdentity(message, producerName, where, settings, { ownSettings: false });
  const record = decodeRecord(message.content, () => false, where);
  if (record.kind !== 'genesis' || identity.publishingId !== GENESIS_ID) {
    throw new DedupError(
      'DEDUP_CHANGELOG_INVALID',
      `changelog "${changelog}" does not begin with its genesis`,
    );
  }
  return record.start;
}

/**
 * The first message of `stream` at offset `from` or after it (its first message when `from` is
 * `undefined`; a chunk that begins before `from` is skipped up to it), or `undefined` when none
 * arrives within `timeoutMs`; `failure` is a decoding failure seen meanwhile. Reads on `client`
 * with a plain consumer, closed before it resolves.
 *
 * @internal
 */
export async function firstMessage(
  client: Client,
  stream: string,
  from: bigint | undefined,
  timeoutMs: number,
): Promise<{ message: StreamMessage | undefined; failure: Error | undefined }> {
  const offset = from === undefined ? Offset.first() : Offset.offset(from);
  let first: ((message: StreamMessage) => void) | undefined;
  const arrived = new Promise<StreamMessage>((resolve) => (first = resolve));
  let failure: Error | undefined;
  const unlisten = listenDecodeErrors(client, (error) => (failure ??= error));
  try {
    const consumer = await withTimeout(
      client.declareConsumer({ stream, offset }, (message) => {
        if (from !== undefined && (message.offset === undefined || message.offset < from)) return;
        const take = first;
        first = undefined;
        take?.(message);
      }),
      timeoutMs,
      `subscribing to "${stream}"`,
    );
    consumerCloseEvents(consumer)?.removeAllListeners(`close_consumer_${consumer.extendedId}`);
    try {
      const message = await withTimeout(arrived, timeoutMs, `reading "${stream}"`).catch(() => undefined);
      return { message, failure };
    } finally {
      await withTimeout(client.closeConsumer(consumer.extendedId), 5_000, 'closing').catch(() => undefined);
    }
  } finally {
    unlisten();
  }
}
