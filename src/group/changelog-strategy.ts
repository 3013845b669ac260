/**
 * The changelog strategy of a group member's partition (docs/design.md §12), for a member with
 * its own LevelDB store: on an activation the partition's state is restored from its changelog
 * stream before anything is applied, and every batch is appended to the changelog before it is
 * written to the store. A member whose append is fenced (another member wrote past it) drops the
 * batch and takes the partition over again.
 */
import { histogramRecorder } from '../telemetry/metrics.js';
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import type { JournalEntry } from '../consumer/commit-pipeline.js';
import type { VerifyingConsumerCore } from '../consumer/core.js';
import type { DedupStore } from '../store/store.js';
import { errorText, withTimeout } from '../transport/util.js';
import { encodeEntry, encodeGenesis, entryId, GENESIS_ID } from './changelog-entry.js';
import { ChangelogWriter, type AppendOutcome } from './changelog-writer.js';
import { groupSettings, SETTINGS_HEADER } from './changelog-identity.js';
import { declaredRetention, retentionArguments, snapshotBudget } from './changelog-retention.js';
import { readGenesis } from './changelog-head.js';
import { changelogLastId } from './restore.js';
import { snapshotProducerName } from './snapshot-entry.js';
import { restoreWithSnapshots } from './snapshot-restore.js';
import { adoptStandbyCopy } from './standby-copy.js';
import { SnapshotWriter } from './snapshot-writer.js';
import { storedChunk } from '../transport/stream-resume.js';
import {
  planPartitionResume,
  PartitionMoved,
  type ActivationContext,
  type ActivationPlan,
  type PartitionHost,
  type PartitionResume,
  type PartitionStrategy,
} from './strategy.js';
import type { PartitionSettings } from './partition-settings.js';

/** How long the restore may wait for the next changelog entry before asking for the end again. */
const RESTORE_STALL_MS = 5_000;

/** Where an activation's state begins when the store had nothing of the partition. */
interface Lineage {
  readonly epoch: number;
  /** No genesis in the changelog yet: the first batch writes one first (§12). */
  needsGenesis: boolean;
  /** The genesis' start: messages before it are not the partition's input (dropped). */
  readonly floor: bigint | undefined;
  /** The first offset processed in this activation: the start a genesis of ours says. */
  firstOffset: bigint | undefined;
  /** The activation's core (a snapshot waits for its committed offset). */
  readonly core: VerifyingConsumerCore;
}

/** @internal */
export class ChangelogStrategy implements PartitionStrategy {
  readonly #s: PartitionSettings;
  readonly #store: DedupStore;
  readonly #host: PartitionHost;
  readonly #writer: ChangelogWriter;
  /** The snapshots' writer and their own changelog writer (§12.1), when snapshots are on. */
  readonly #snapshots: { readonly writer: SnapshotWriter; readonly appender: ChangelogWriter } | undefined;
  #lineage: Lineage | undefined;
  /** Resolves once the last batch journaled handed its entry to the writer (or gave up). */
  #handedOver: Promise<void> = Promise.resolve();
  /** The last batch's journal (a snapshot waits for its batch's store write, unless it failed). */
  #lastJournal: Promise<void> = Promise.resolve();

  constructor(settings: PartitionSettings, store: DedupStore, host: PartitionHost) {
    this.#s = settings;
    this.#store = store;
    this.#host = host;
    this.#writer = changelogWriter(settings, host, settings.changelogProducer);
    this.#snapshots = this.#snapshotWriter(settings, store, host);
  }

  #snapshotWriter(
    settings: PartitionSettings,
    store: DedupStore,
    host: PartitionHost,
  ): { writer: SnapshotWriter; appender: ChangelogWriter } | undefined {
    const policy = settings.snapshots;
    if (policy === undefined || (policy.everyEntries === 0 && policy.everyBytes === 0)) return undefined;
    const producer = snapshotProducerName(settings.changelogProducer);
    const appender = changelogWriter(settings, host, producer);
    const writer = new SnapshotWriter({
      db: store.db,
      namespace: settings.namespace,
      changelog: settings.changelog,
      entryProducer: settings.changelogProducer,
      producer,
      policy,
      writer: appender,
      timeoutMs: RESTORE_STALL_MS,
    });
    return { writer, appender };
  }

  readonly lastWritten = (client: Client, timeoutMs: number): Promise<bigint> =>
    changelogLastId(client, this.#s.changelog, this.#s.changelogProducer, timeoutMs, true);

  async close(): Promise<void> {
    this.#closed = true;
    this.#dropSnapshotClient();
    await Promise.all([this.#writer.close(), this.#snapshots?.appender.close()]);
    // After the writers: a genesis append they ended drops its reader first.
    while (this.#strayReaders.size > 0) await Promise.all([...this.#strayReaders]);
  }

  /**
   * Warns when the existing changelog was created with other retention arguments than this
   * member's (§12.2): the broker keeps a stream's arguments for good, so the changelog keeps its
   * own (without retention it keeps every entry; with another, a trimmed snapshot stops a take-over
   * with `DEDUP_CHANGELOG_INVALID`, never a guess).
   */
  async #checkRetention(client: Client): Promise<void> {
    const declared = await declaredRetention(client, this.#s.changelog, this.#s.retention, RESTORE_STALL_MS);
    if (declared !== 'other') return;
    this.#host.log.warn(
      {
        partition: this.#s.partition,
        changelog: this.#s.changelog,
        retention: retentionArguments(this.#s.retention),
      },
      "stream-dedup: the changelog exists with other retention arguments than this member's changelogRetention; " +
        'the broker keeps those it was created with (delete or recreate the changelog to change them)',
    );
  }

  async activate({ epoch, current, openCore }: ActivationContext): Promise<ActivationPlan> {
    // A standby copy of the partition is no longer tailed from here on (§12.3), and may be adopted.
    const standby = this.#s.standby;
    // The restore below (or an adopted copy) writes entries the snapshot writer never noted: its
    // running bound on the state's bytes no longer holds (revG finding 1).
    this.#snapshots?.writer.forgetBound();
    await standby?.claim(this.#s.partition);
    let client: Client;
    try {
      client = await this.#host.connectReader();
    } catch (err) {
      standby?.release(this.#s.partition);
      throw err;
    }
    let report;
    let resume: PartitionResume | undefined;
    const started = performance.now();
    try {
      if (standby !== undefined) await this.#adoptStandby(client, current);
      const restore = {
        db: this.#store.db,
        sync: this.#store.sync,
        namespace: this.#s.namespace,
        changelog: this.#s.changelog,
        producerName: this.#s.changelogProducer,
        settings: groupSettings(this.#s.consumer, this.#s.tenantVersion),
        client,
        stallMs: RESTORE_STALL_MS,
        timeoutMs: this.#s.restoreTimeoutMs,
        isCurrent: current,
      };
      report = await restoreWithSnapshots(
        restore,
        {
          reference: snapshotProducerName(this.#s.changelogProducer),
          producerName: snapshotProducerName(this.#s.changelogProducer),
        },
        (fields, message) => this.#host.log.warn({ ...fields, partition: this.#s.partition }, message),
      );
      this.#snapshots?.writer.forgetBound();
      if (report.snapshot !== undefined) this.#host.stats.snapshotRestores++;
      histogramRecorder('restoreDuration', { group: this.#s.consumerName, partition: this.#s.partition })(
        performance.now() - started,
      );
      if (report.changelogLastId > 0n) await this.#checkRetention(client);
      if (report.offset !== undefined) {
        resume = await planPartitionResume(
          client,
          this.#host,
          report.offset,
          await storedChunk(this.#store.db, this.#s.namespace),
          `changelog "${this.#s.changelog}"`,
        );
      }
    } finally {
      standby?.release(this.#s.partition);
      await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
    }
    if (!current()) throw new PartitionMoved(this.#s.partition, 'moved');
    // The changelog writer connects while the core opens and the first batch is processed: that
    // batch need not wait for it. Only to a changelog that exists: the writer creates a missing
    // one, and a restore of another member asking for the last ID of a stream being created got no
    // answer for 5 s (measured; it then retried the take-over). A new changelog is created by its
    // first append, as before.
    if (report.changelogLastId > 0n) {
      this.#writer.warmUp();
      // The snapshots' appender too: a partition's first snapshot waited 170–640 ms for its
      // connect inside the commit path (bench37b: the first snapshot of a read 308–525 ms median,
      // the later ones 137). Same stream, so the same rule: only to a changelog that exists.
      this.#snapshots?.appender.warmUp();
    }
    const core = await openCore((entry) => this.#journal(epoch, entry));
    const lineage: Lineage = {
      epoch,
      needsGenesis: report.offset === undefined && report.start === undefined,
      floor: report.offset === undefined ? report.start : undefined,
      firstOffset: undefined,
      core,
    };
    this.#lineage = lineage;
    return {
      core,
      resume,
      offset: report.offset,
      start:
        resume !== undefined
          ? resume.plan.offset
          : report.offset !== undefined
            ? report.offset + 1n
            : report.start,
      read: report.read,
      applied: report.applied,
      accept: (offset) => {
        // A chunk begins before the offset asked for: what lies before the genesis' start is not input.
        if (lineage.floor !== undefined && offset < lineage.floor) return false;
        lineage.firstOffset ??= offset;
        return true;
      },
    };
  }

  /**
   * Replaces the partition's namespace with this member's standby copy of it when the copy is
   * usable and newer (standby-copy.ts): the restore that follows then reads only the tail.
   */
  async #adoptStandby(client: Client, current: () => boolean): Promise<void> {
    const outcome = await adoptStandbyCopy({
      db: this.#store.db,
      sync: this.#store.sync,
      namespace: this.#s.namespace,
      changelog: this.#s.changelog,
      client,
      timeoutMs: RESTORE_STALL_MS,
      isCurrent: current,
    });
    const fields = { consumer: this.#s.consumerName, partition: this.#s.partition };
    if (outcome.kind === 'adopted') {
      this.#host.stats.standbyTakeOvers++;
      this.#host.log.info(
        { ...fields, offset: outcome.offset.toString(), keys: outcome.keys },
        "stream-dedup: taking the partition over from this member's standby copy",
      );
    } else if (outcome.kind === 'ignored') {
      this.#host.log.info({ ...fields, why: outcome.why }, 'stream-dedup: standby copy not used');
    }
  }

  /**
   * Appends a batch to the changelog; the batch is written to the store only once this resolves.
   * The partition's first batch ever is preceded by the genesis (§12).
   */
  async #journal(epoch: number, entry: JournalEntry): Promise<void> {
    // Batches are journaled while the ones before them still wait for their confirms
    // (appendsInFlight): each hands its entry to the writer only after the one before it did (and
    // after the genesis, which the first batch writes and reads back first), so that the writer
    // sends them in the order they were computed.
    const before = this.#handedOver;
    const previous = this.#lastJournal;
    let handed = (): void => undefined;
    this.#handedOver = new Promise<void>((resolve) => (handed = resolve));
    const journaled = (async (): Promise<void> => {
      try {
        await before;
        const partition = this.#s.partition;
        if (epoch !== this.#host.epoch)
          throw new PartitionMoved(partition, 'moved before its batch was appended');
        const lineage = this.#lineage?.epoch === epoch ? this.#lineage : undefined;
        if (entry.baseOffset === undefined && lineage?.needsGenesis === true) {
          const start = lineage.firstOffset;
          if (start === undefined) throw new Error('a first batch without a first offset');
          await this.#append(epoch, 'its genesis', () => this.#appendGenesis(epoch, start));
          lineage.needsGenesis = false;
        }
        // A snapshot is of the state of the changelog's latest entry, before the next (§12.1): with
        // batches in flight the one before this may not be in the store yet, so it waits for that
        // write first (it never waits for this batch's entry: no deadlock); not written → no snapshot.
        const snapshots = this.#snapshots;
        if (
          snapshots?.writer.due === true &&
          lineage !== undefined &&
          (await this.#storeReached(epoch, lineage.core, entry.baseOffset, previous))
        ) {
          await this.#writeSnapshot(epoch, snapshots.writer);
        }
        const encoded = encodeEntry({
          lastOffset: entry.lastOffset,
          baseOffset: entry.baseOffset,
          ops: entry.ops,
        });
        // The writer queues the entry before this call returns: the next batch may follow.
        const appended = this.#append(epoch, 'its batch', () =>
          this.#writer.append(encoded, entryId(entry.lastOffset), () => epoch === this.#host.epoch),
        );
        // Counted as it is handed over, not once it landed: with batches in flight the next batch's
        // `due` must see this one, or a snapshot came up to appendsInFlight − 1 entries late and a
        // take-over read that many more (consumer-group-snapshot at depth 4: 9 entries, not ≤ 6).
        // An entry of an activation that ended counts toward `due` but breaks the bound's chain: it
        // may never land, and the next activation restores another member's entry at its offsets.
        snapshots?.writer.noteEntry(encoded.length, epoch === this.#host.epoch ? entry : undefined);
        handed();
        await appended;
      } finally {
        handed();
      }
    })();
    this.#lastJournal = journaled;
    return journaled;
  }

  /**
   * Whether the store holds the batch before the one being journaled (the core's committed offset
   * reached `baseOffset`); false once that batch cannot be written any more: its journal failed,
   * the core stopped or closed, or the activation ended. The batch before never waits for this one's
   * journal (commit-pipeline.ts writes batch n after its own journal and batch n − 1 only).
   */
  async #storeReached(
    epoch: number,
    core: VerifyingConsumerCore,
    baseOffset: bigint | undefined,
    previous: Promise<void>,
  ): Promise<boolean> {
    const committed = core.committedOffset;
    if (baseOffset === undefined || (committed !== undefined && committed >= baseOffset)) return true;
    const reached = core.waitForOffset(baseOffset).then(
      () => true,
      () => false,
    );
    const failed = previous.then(
      () => reached,
      () => false,
    );
    return (await Promise.race([reached, failed])) && epoch === this.#host.epoch;
  }

  /**
   * Writes a snapshot of the partition's state (§12.1). Snapshots only speed take-overs up: one
   * that fails is logged and the batch goes on.
   */
  /**
   * The snapshots' reader client, kept from one snapshot to the next (a connect per snapshot was
   * ~50 ms of the commit path's wait, each time); dropped and closed after a snapshot that failed,
   * and by `close()`. Only the writer's locator-connection requests use it (last IDs, stats, the
   * reference's offset), each bounded by its own time-out.
   */
  #snapshotClient: Promise<Client> | undefined;
  #closed = false;

  #dropSnapshotClient(): void {
    const client = this.#snapshotClient;
    this.#snapshotClient = undefined;
    if (client !== undefined) this.#dropReader(client);
  }

  async #writeSnapshot(epoch: number, writer: SnapshotWriter): Promise<void> {
    const current = (): boolean => epoch === this.#host.epoch;
    const started = performance.now();
    let failed = true;
    try {
      if (this.#closed) return;
      this.#snapshotClient ??= this.#host.connectReader();
      const client = await this.#snapshotClient;
      const outcome = await writer.write(client, current);
      failed = false;
      const fields = {
        consumer: this.#s.consumerName,
        partition: this.#s.partition,
        ms: Math.round(performance.now() - started),
      };
      if (outcome.kind === 'written') {
        this.#host.stats.snapshotsWritten++;
        this.#host.log.info(
          {
            ...fields,
            offset: outcome.offset.toString(),
            parts: outcome.parts,
            keys: outcome.keys,
            bytes: outcome.bytes,
          },
          'stream-dedup: changelog snapshot written',
        );
        const budget =
          this.#s.retention === undefined || this.#s.snapshots === undefined
            ? undefined
            : snapshotBudget(this.#s.retention, this.#s.snapshots);
        if (budget !== undefined && outcome.bytes > budget)
          this.#host.log.error(
            { ...fields, bytes: outcome.bytes, budget },
            "stream-dedup: the changelog snapshot is larger than changelogRetention leaves room for (§12.2): the partition's " +
              'state outgrew the retention, a take-over may find its snapshot trimmed (DEDUP_CHANGELOG_INVALID); raise maxLengthBytes',
          );
      } else if (outcome.kind === 'too-large') {
        this.#host.log.error(
          { ...fields, bytes: outcome.bytes, maxBytes: outcome.maxBytes },
          "stream-dedup: changelog snapshot not written: the partition's state holds more than the snapshot cap (§12.1); " +
            'a take-over with an empty store reads the whole changelog, or with changelogRetention finds its snapshot trimmed (DEDUP_CHANGELOG_INVALID)',
        );
      } else if (current()) {
        this.#host.log.info({ ...fields, why: outcome.why }, 'stream-dedup: changelog snapshot skipped');
      }
    } catch (err) {
      if (current())
        this.#host.log.warn(
          { consumer: this.#s.consumerName, partition: this.#s.partition, err: errorText(err) },
          'stream-dedup: writing a changelog snapshot failed; the partition goes on without it',
        );
    } finally {
      if (failed || this.#closed) this.#dropSnapshotClient();
    }
  }

  /** One changelog append of the activation `epoch`: resolves once it is the changelog's latest. */
  async #append(epoch: number, what: string, write: () => Promise<AppendOutcome>): Promise<void> {
    const partition = this.#s.partition;
    let outcome;
    try {
      outcome = await write();
    } catch (err) {
      if (epoch === this.#host.epoch) {
        if (
          err instanceof DedupError &&
          (err.code === 'DEDUP_BROKER_REFUSED' ||
            err.code === 'DEDUP_CHANGELOG_INVALID' ||
            err.code === 'DEDUP_UNSAFE_OPTIONS')
        ) {
          this.#host.fail(err);
        } else {
          this.#host.restart(`could not append to its changelog: ${errorText(err)}`);
        }
      }
      throw new PartitionMoved(partition, `could not append ${what} to the changelog`, { cause: err });
    }
    // Moved while the entry was on its way: it may be in the changelog (where it is a consistent
    // state, §12), but nothing more of this partition is applied here.
    if (epoch !== this.#host.epoch) throw new PartitionMoved(partition, `moved while ${what} was appended`);
    if (outcome === 'fenced') {
      this.#host.stats.fenced++;
      this.#host.log.warn(
        { consumer: this.#s.consumerName, partition, what },
        'stream-dedup: another member wrote past this one in the changelog; dropping the batch and taking the partition over again',
      );
      this.#host.restart('was fenced: another member wrote past this one in its changelog');
      throw new PartitionMoved(partition, 'was fenced');
    }
  }

  /**
   * Writes the genesis "the partition begins at `start`" with ID 1. Of two members beginning the
   * partition at once the broker keeps the first genesis and drops the other (confirming both):
   * with the last ID at 1, the genesis itself says whose it is. Another member's is a fence: this
   * member takes the partition over again, and its restore starts where that genesis says.
   */
  /**
   * Read-back readers connected for a genesis that was not read back (the append failed, was fenced
   * or the partition moved): each settles once its connect ended and, if it opened, the client is
   * closed; `close()` waits for them (bounded by the connect's own time-outs and 5 s to close), so
   * no connection is opened after it returned (revG finding 2).
   */
  readonly #strayReaders = new Set<Promise<void>>();

  #dropReader(connecting: Promise<Client>): void {
    const settled = closeWhenOpen(connecting).finally(() => this.#strayReaders.delete(settled));
    this.#strayReaders.add(settled);
  }

  async #appendGenesis(epoch: number, start: bigint): Promise<AppendOutcome> {
    // The reader of the read-back connects while the genesis is appended: after it, the connect
    // was one more step before the partition's first commit (measured on a loaded machine: 1.8 s
    // of a 3.4 s first commit). It reads only once the genesis landed, as before; unused, it closes.
    const reader = this.#host.connectReader();
    // Its failure is met at the read-back, or ignored (no unhandled rejection meanwhile).
    reader.catch(() => undefined);
    let outcome: AppendOutcome;
    try {
      outcome = await this.#writer.append(encodeGenesis(start), GENESIS_ID, () => epoch === this.#host.epoch);
    } catch (err) {
      this.#dropReader(reader);
      throw err;
    }
    // Moved meanwhile: #append drops the batch anyway; no reading back (close() would wait for it).
    if (outcome !== 'landed' || epoch !== this.#host.epoch) {
      this.#dropReader(reader);
      return outcome;
    }
    const client = await reader;
    try {
      const winner = await readGenesis(
        client,
        this.#s.changelog,
        this.#s.changelogProducer,
        RESTORE_STALL_MS,
        groupSettings(this.#s.consumer, this.#s.tenantVersion),
      );
      if (winner === start) return 'landed';
      this.#host.log.warn(
        {
          consumer: this.#s.consumerName,
          partition: this.#s.partition,
          start: start.toString(),
          genesis: winner.toString(),
        },
        'stream-dedup: another member began the partition at another offset first; starting again from its',
      );
      return 'fenced';
    } finally {
      await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
    }
  }
}

/**
 * A writer of the partition's changelog under `producerName`: the entries' (the group's changelog
 * producer) or the snapshots' — the same stream, connection, bounds, settings header and retention.
 */
function changelogWriter(
  settings: PartitionSettings,
  host: PartitionHost,
  producerName: string,
): ChangelogWriter {
  return new ChangelogWriter({
    stream: settings.changelog,
    producerName,
    connection: settings.connection,
    connectTimeoutMs: settings.subscription.connectTimeoutMs,
    appendTimeoutMs: settings.appendTimeoutMs,
    reconnect: settings.subscription.reconnect,
    logger: host.log,
    headers: { [SETTINGS_HEADER]: groupSettings(settings.consumer, settings.tenantVersion) },
    streamArguments: retentionArguments(settings.retention),
  });
}

/**
 * Closes a connection that is being opened once it is open (bounded); a failed connect is ignored.
 * Settles (never rejects) once the connect failed or the client closed (or 5 s passed closing it).
 */
function closeWhenOpen(connecting: Promise<Client>): Promise<void> {
  return connecting.then(
    (client) => withTimeout(client.close(), 5_000, 'closing').catch(() => undefined),
    () => undefined,
  );
}
