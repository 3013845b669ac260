/**
 * What `open()` reads and decides before the publisher core exists: the producer's stored state,
 * the broker's last ID, the reconcile plan, and the outbox as entries to re-send. The core then
 * re-sends or re-assigns them; the rules themselves are in reconcile.ts.
 */
import { DedupError } from '../errors.js';
import type { LoadedProducer, ProducerState } from '../store/store.js';
import type { Logger } from '../telemetry/logger.js';
import { Entry, type Segment } from './entry.js';
import { asDedupError, storeWrite } from './errors.js';
import { forgetUnstoredKeys, type KeyedIds, type StoredKeySegments } from './keyed.js';
import type { ResolvedPublisherOptions } from './options.js';
import { assertSameIdMode, reconcile, type ReconcilePlan } from './reconcile.js';
import { stampBytesOf } from './message.js';
import { attachBatches, DEFAULT_MAX_UNCOMPRESSED_BATCH_BYTES, oversizedBatch } from './sub-entries.js';
import type { OpenReport, PublishTransport, TransportHandlers } from './types.js';

/** The outcome of the open-time reads: where to start and what the outbox holds. */
export interface Startup {
  readonly plan: ReconcilePlan;
  readonly segments: LoadedProducer['segments'];
  readonly keySegments: StoredKeySegments;
  readonly report: OpenReport;
}

/**
 * Loads the producer's state, connects (declaring the producer) and reconciles. Keys of an outbox
 * the broker never stored are forgotten here, before anything is sent (reconcile decides which).
 */
export async function startUp(
  state: ProducerState,
  transport: PublishTransport,
  opts: ResolvedPublisherOptions,
  handlers: TransportHandlers,
): Promise<Startup> {
  const loaded = await state.load();
  assertSameIdMode(loaded.meta, opts.idMode, opts.producerName);
  // Resuming re-sends the outbox's batches as they were cut; adopting re-cuts them under new IDs,
  // and only the broker tells which it is: with onBrokerAhead 'error' (the default) it is known
  // before connecting.
  const resumeKnown = opts.onBrokerAhead !== 'adopt';
  if (resumeKnown) assertBatchesFit(loaded.segments, transport, opts.producerName);
  let brokerLast: bigint | undefined;
  try {
    brokerLast = await transport.connect(handlers);
  } catch (err) {
    throw asDedupError(
      err,
      'DEDUP_BROKER_UNREACHABLE',
      `cannot connect to the broker for "${transport.target}"`,
    );
  }
  const outbox = loaded.segments.flatMap((s) => s.entries);
  const plan = reconcile({
    producerName: opts.producerName,
    target: transport.target,
    idMode: opts.idMode,
    durability: opts.durability,
    onBrokerAhead: opts.onBrokerAhead,
    meta: loaded.meta,
    outboxSize: outbox.length,
    outboxLast: outbox.length > 0 ? outbox[outbox.length - 1]!.publishingId : 0n,
    brokerLast,
  });
  if (!resumeKnown && plan.kind === 'resume') assertBatchesFit(loaded.segments, transport, opts.producerName);
  let keySegments: StoredKeySegments = opts.idMode === 'keyed' ? await state.loadKeySegments() : [];
  if (plan.forgetKeysAbove !== undefined) {
    keySegments = await storeWrite(forgetUnstoredKeys(state, keySegments, plan.forgetKeysAbove, outbox));
  }
  const adopt = plan.kind === 'adopt';
  return {
    plan,
    segments: loaded.segments,
    keySegments,
    report: {
      localLastId: plan.localLast,
      brokerLastId: brokerLast,
      resent: adopt ? 0 : outbox.length,
      reassigned: adopt ? outbox.length : 0,
    },
  };
}

/**
 * Refuses an outbox holding a sub-entry batch above the transport's cap (`maxBatchBytes`): one cut
 * in an earlier life under a higher `subEntry.maxUncompressedBytes`. It would be re-sent whole (its
 * cut is kept, docs/design.md §10), refused by the broker with publish error 17 at every re-send
 * and retried as a lost connection for ever. Over a transport that sends each member alone (AMQP
 * 0-9-1) no batch is re-sent.
 *
 * @throws DedupError `DEDUP_UNSAFE_OPTIONS`, naming the batch, its size and the setting to raise.
 */
export function assertBatchesFit(
  segments: LoadedProducer['segments'],
  transport: PublishTransport,
  producerName: string,
): void {
  if (transport.carriesBatches !== true) return;
  const cap = transport.maxBatchBytes ?? DEFAULT_MAX_UNCOMPRESSED_BATCH_BYTES;
  const stampBytes = stampBytesOf(producerName);
  for (const s of segments) {
    if (s.batches === undefined) continue;
    const over = oversizedBatch(s.entries, s.batches, stampBytes, cap);
    if (over === undefined) continue;
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      `the outbox of producer "${producerName}" on "${transport.target}" holds a sub-entry batch of ` +
        `${over.messages} messages (IDs ${over.firstId}..${over.lastId}) of about ${over.bytes} bytes uncompressed, ` +
        `above the cap of ${cap} bytes (subEntry.maxUncompressedBytes): it was cut under a higher cap and is ` +
        `re-sent as it was cut, so the broker would refuse it at every re-send. Open with ` +
        `subEntry.maxUncompressedBytes (and the broker's stream.max_uncompressed_sub_entry_batch_size) at least ` +
        `${over.bytes} until the outbox is confirmed, then lower it.`,
    );
  }
}

/**
 * Resuming: the outbox as entries with their own IDs, each tied to its segment and key record, and
 * to the sub-entry batch it was first sent in when the transport sends batches as one entry
 * (`carriesBatches`). Over a transport that does not (AMQP 0-9-1), each member is sent and
 * confirmed alone: tied to its batch, the first member's confirm would settle them all.
 */
export function recoveredEntries(
  segments: LoadedProducer['segments'],
  keyed: KeyedIds | undefined,
  carriesBatches: boolean,
): Entry[] {
  const entries: Entry[] = [];
  for (const s of segments) {
    const segment: Segment = { firstId: s.firstId, remaining: s.entries.length };
    const first = entries.length;
    for (const e of s.entries) {
      const entry = new Entry(e.publishingId, e.body, e.headers, e.key);
      entry.segment = segment;
      keyed?.adopt(entry);
      entries.push(entry);
    }
    // The batches the segment was first sent in, whatever the options now (docs/design.md §10).
    if (s.batches !== undefined && carriesBatches) attachBatches(entries.slice(first), s.batches);
  }
  return entries;
}

/** The log line of an open publisher: where it starts and what it re-sends. */
export function logOpen(log: Logger, producer: string, target: string, report: OpenReport): void {
  log.info(
    {
      producer,
      target,
      localLastId: report.localLastId.toString(),
      brokerLastId: report.brokerLastId?.toString(),
      resent: report.resent,
      reassigned: report.reassigned,
    },
    'stream-dedup: publisher open',
  );
}
