import { DedupError } from '../errors.js';
import { ID_HEADER, PRODUCER_HEADER, SKIP_HEADER } from '../identity/headers.js';
import { assertProducerName } from '../identity/producer-name.js';
import { assertPublishingId, MAX_PUBLISHING_ID } from '../identity/publishing-id.js';
import { measureUtf8 } from '../identity/utf8.js';
import type { Headers, IdMode, KeyEntry, KeyRecord, ProducerMeta } from '../store/codec.js';
import { DedupStore, type ProducerState } from '../store/store.js';
import { KeyIndex } from './key-index.js';
import { PendingQueue } from './pending.js';
import { silentLogger, type Logger } from '../telemetry/logger.js';
import { observePublisher, type PublisherCounters } from '../telemetry/metrics.js';
import type {
  DedupPublisherOptions,
  OutgoingMessage,
  Durability,
  OpenReport,
  PublishTransport,
  SendOptions,
  SendResult,
} from './types.js';

/**
 * A message between `send()` and its confirm. A class with every field set in the constructor:
 * one shape for every entry, and nothing allocated beside it on the common path (an entry lives
 * until its confirm, so its size is what each young-generation collection copies).
 */
class Entry implements OutgoingMessage {
  /** Settles the caller's promise; absent for messages recovered from the outbox. */
  resolve: ((result: SendResult) => void) | undefined = undefined;
  reject: ((error: Error) => void) | undefined = undefined;
  /** The outbox segment holding it (outbox durability). */
  segment: Segment | undefined = undefined;
  /** When it was last handed to the transport (whole ms, monotonic); 0 when not yet sent on this connection. */
  sentAt = 0;
  /** Keyed sends: the key's record in the index (no map lookup when the message settles). */
  keyRecord: LiveKey | undefined = undefined;
  /** Rare parts: an abort signal, repeats of the key waiting for this message. */
  extra: EntryExtra | undefined = undefined;

  constructor(
    /** Mutable only while the entry waits for room, unwritten and unsent (renumbered after an abort). */
    public publishingId: bigint,
    readonly body: Uint8Array,
    public headers: Headers | undefined,
    /** Keyed sends: the domain key. */
    readonly key: string | undefined,
  ) {}
}

/** What only some entries need. */
interface EntryExtra {
  onAbort?: (() => void) | undefined;
  signal?: AbortSignal | undefined;
  /** Repeats of the key that arrived while this message was in flight: settled with it. */
  keyWaiters?: KeyWaiter[] | undefined;
  /** The last ID handed out before this one: restored when this one, the last, is aborted unsent. */
  prevAssigned?: bigint | undefined;
}

/**
 * A key in the in-memory index (and, as a `KeyEntry`, its record for the key segment: no copy per
 * key at commit); `inFlight` is its first send while that is unconfirmed.
 */
interface LiveKey extends KeyEntry {
  /** Mutable only while its first send waits for room (renumbered after an abort). */
  publishingId: bigint;
  inFlight: Entry | undefined;
}

/** A key segment in the store: one group commit's keys, dropped whole when past the retention. */
interface KeySegment {
  readonly firstId: bigint;
  readonly lastId: bigint;
  readonly newestMs: number;
  /** Its keys' records, to drop them from the index without a scan of the index. */
  readonly records: readonly LiveKey[];
}

/** A repeat of a key that waits for the first send of the key. */
interface KeyWaiter {
  resolve(publishingId: bigint): void;
  reject(error: Error): void;
}

/** One group commit's record, deleted once every message in it is confirmed. */
interface Segment {
  readonly firstId: bigint;
  remaining: number;
}

type State = 'open' | 'reconnecting' | 'closing' | 'closed';

const DEFAULTS = {
  durability: 'outbox' as Durability,
  maxInFlight: 5_000,
  maxBatch: 2_000,
  reserveBlock: 10_000,
  confirmTimeoutMs: 30_000,
  closeTimeoutMs: 10_000,
  initialDelayMs: 100,
  maxDelayMs: 5_000,
  giveUpAfterMs: 120_000,
  watchIntervalMs: 0,
};

const RESERVED_PREFIX = 'x-dedup-';
/** `send()` without options: one shared empty object instead of a new one per call. */
const NO_OPTIONS: SendOptions = Object.freeze({});

// A promise's settlers, taken by one shared executor: `new Promise((resolve, reject) => ...)` with
// a closure allocates the closure and its context for every send. Read them right after `new Promise`.
let capturedResolve: ((result: SendResult) => void) | undefined;
let capturedReject: ((error: Error) => void) | undefined;
function captureSettlers(resolve: (result: SendResult) => void, reject: (error: Error) => void): void {
  capturedResolve = resolve;
  capturedReject = reject;
}

function positiveInt(value: number | undefined, fallback: number, what: string, allowZero = false): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < (allowZero ? 0 : 1)) {
    throw new RangeError(`${what} must be an integer ≥ ${allowZero ? 0 : 1}, got ${value}`);
  }
  return value;
}

/**
 * The transport-agnostic dedup publisher: it assigns and persists publishing IDs, keeps the
 * outbox, reconciles with the broker on open and after every reconnect, applies backpressure and
 * settles `send()` on confirm. Transports (stream protocol, AMQP 0-9-1) wrap it.
 *
 * @internal Applications use `StreamDedupPublisher` or `AmqpDedupPublisher`.
 */
export class DedupPublisherCore {
  readonly producerName: string;
  readonly durability: Durability;
  readonly idMode: IdMode;
  readonly report: OpenReport;
  /** Counters since open (also reported as OpenTelemetry metrics). */
  readonly counters: PublisherCounters = {
    sent: 0,
    confirmed: 0,
    resent: 0,
    keyDuplicates: 0,
    reconnects: 0,
  };
  readonly #log: Logger;
  #unobserve: () => void = () => undefined;

  readonly #transport: PublishTransport;
  /** Room the identity stamps take in a message (name, a 20-digit ID, AMQP overhead). */
  readonly #stampBytes: number;
  readonly #state: ProducerState;
  readonly #ownedStore: DedupStore | undefined;
  readonly #opts: Required<
    Pick<
      DedupPublisherOptions,
      'maxInFlight' | 'maxBatch' | 'reserveBlock' | 'confirmTimeoutMs' | 'closeTimeoutMs' | 'watchIntervalMs'
    >
  > & { initialDelayMs: number; maxDelayMs: number; giveUpAfterMs: number };

  #status: State = 'open';
  /** Set by `close()`: new sends are refused while accepted ones drain. */
  #closeRequested = false;
  #fatal: DedupError | undefined;
  /** Highest ID handed out (written to the store before it leaves in outbox mode). */
  #lastAssigned: bigint;
  /** Highest ID durable in the store (meta.lastId). */
  #lastDurable: bigint;
  #reservedUpTo: bigint;
  /** Sends waiting for room, in ID order, from #waitingHead on (a queue without O(n) shifts). */
  #waiting: Entry[] = [];
  #waitingHead = 0;
  /** Accepted, not yet committed to the store, in ID order. */
  #batch: Entry[] = [];
  /** Committed, waiting for the confirm, in ID order (Map keeps insertion order). */
  readonly #pending = new PendingQueue<Entry>();
  #segmentsToDelete: bigint[] = [];
  /**
   * Keyed mode: every retained key and the ID it was first published with — the exact index,
   * loaded from the store's key segments on open, written through one segment per group commit.
   */
  readonly #keys = new KeyIndex<LiveKey>();
  /** The key segments in the store, oldest first, for retention. */
  readonly #keySegments: KeySegment[] = [];
  #keySegmentsToDelete: bigint[] = [];
  #pruneTimer: NodeJS.Timeout | undefined;
  readonly #keyRetention: { readonly maxKeys: number; readonly maxAgeMs: number };
  #pumping = false;
  /** Messages of the group commit being written: in neither #batch nor #pending meanwhile. */
  #committingCount = 0;
  #pumpScheduled = false;
  #resendAll = false;
  #epoch = 0;
  #timer: NodeJS.Timeout | undefined;
  #watchTimer: NodeJS.Timeout | undefined;
  #reconnectWake: (() => void) | undefined;
  /** A skip to declare on the next new ID (`x-dedup-skip-from`): the first ID skipped. */
  #skipToDeclare: bigint | undefined;
  /** The skip written in the store's meta until the message declaring it is confirmed. */
  #persistedSkipFrom: bigint | undefined;
  /** The ID of the message that declares the pending skip. */
  #skipDeclaringId: bigint | undefined;
  /** The meta changed (a declared skip was confirmed): the next pump writes it. */
  #metaDirty = false;
  /** The highest ID written in an outbox commit, ever (meta.outboxHigh). */
  #outboxHigh = 0n;
  /** The reconnect loop while one runs: close() waits for it before closing the transport. */
  #reconnectLoop: Promise<void> | undefined;
  #closing: Promise<void> | undefined;
  readonly #closedPromise: Promise<DedupError | undefined>;
  #resolveClosed!: (value: DedupError | undefined) => void;
  readonly #idle: Array<() => void> = [];

  private constructor(
    transport: PublishTransport,
    state: ProducerState,
    ownedStore: DedupStore | undefined,
    options: DedupPublisherOptions,
    localLast: bigint,
    reservedUpTo: bigint,
    report: OpenReport,
  ) {
    this.producerName = options.producerName;
    this.durability = options.durability ?? DEFAULTS.durability;
    this.idMode = options.idMode ?? 'auto';
    this.#transport = transport;
    // Name and ID stamps, AMQP overhead, and a skip declaration on the rare message that has one.
    this.#stampBytes = Buffer.byteLength(options.producerName) + 104;
    this.#log = options.logger ?? silentLogger;
    this.#keyRetention = {
      maxKeys: positiveInt(options.keyRetention?.maxKeys, 100_000, 'keyRetention.maxKeys'),
      maxAgeMs: positiveInt(options.keyRetention?.maxAgeMs, 7 * 24 * 3_600_000, 'keyRetention.maxAgeMs'),
    };
    this.#state = state;
    this.#ownedStore = ownedStore;
    this.#lastAssigned = localLast;
    this.#lastDurable = localLast;
    this.#reservedUpTo = reservedUpTo;
    this.report = report;
    const r = options.reconnect ?? {};
    this.#opts = {
      maxInFlight: positiveInt(options.maxInFlight, DEFAULTS.maxInFlight, 'maxInFlight'),
      maxBatch: positiveInt(options.maxBatch, DEFAULTS.maxBatch, 'maxBatch'),
      reserveBlock: positiveInt(options.reserveBlock, DEFAULTS.reserveBlock, 'reserveBlock'),
      confirmTimeoutMs: positiveInt(options.confirmTimeoutMs, DEFAULTS.confirmTimeoutMs, 'confirmTimeoutMs'),
      closeTimeoutMs: positiveInt(options.closeTimeoutMs, DEFAULTS.closeTimeoutMs, 'closeTimeoutMs', true),
      watchIntervalMs: positiveInt(
        options.watchIntervalMs,
        DEFAULTS.watchIntervalMs,
        'watchIntervalMs',
        true,
      ),
      initialDelayMs: positiveInt(r.initialDelayMs, DEFAULTS.initialDelayMs, 'reconnect.initialDelayMs'),
      maxDelayMs: positiveInt(r.maxDelayMs, DEFAULTS.maxDelayMs, 'reconnect.maxDelayMs'),
      giveUpAfterMs: positiveInt(r.giveUpAfterMs, DEFAULTS.giveUpAfterMs, 'reconnect.giveUpAfterMs'),
    };
    this.#closedPromise = new Promise((resolve) => (this.#resolveClosed = resolve));
  }

  /**
   * Opens the store, claims the producer, connects, reconciles local and broker IDs and queues
   * the outbox for re-sending before any new message.
   */
  static async open(
    transport: PublishTransport,
    options: DedupPublisherOptions,
  ): Promise<DedupPublisherCore> {
    validateOptions(options);
    const ownedStore =
      typeof options.store === 'string'
        ? await DedupStore.open(options.store, { sync: options.sync ?? false })
        : undefined;
    const store = ownedStore ?? (options.store as DedupStore);
    let state: ProducerState | undefined;
    // The core must exist before connecting: confirms for re-sent messages go to it.
    const handlersTarget: { core?: DedupPublisherCore } = {};
    try {
      state = store.claimProducer(transport.target, options.producerName);
      const idMode = options.idMode ?? 'auto';
      const loaded = await state.load();
      if (loaded.meta !== undefined && loaded.meta.idMode !== idMode) {
        throw new DedupError(
          'DEDUP_ID_MODE_MISMATCH',
          `producer "${options.producerName}" was opened with idMode '${loaded.meta.idMode}' before; ` +
            `reopening it with '${idMode}' could reuse IDs. Use the same idMode, or another producer name.`,
        );
      }
      const meta = loaded.meta;
      const localLast =
        meta === undefined ? 0n : meta.lastId > meta.reservedUpTo ? meta.lastId : meta.reservedUpTo;
      // Every ID up to it reached the broker or is in the outbox. A store of 0.1 did not record it:
      // one that never reserved IDs wrote every commit with an outbox.
      const outboxHigh =
        meta?.outboxHigh ?? (meta !== undefined && meta.reservedUpTo === 0n ? meta.lastId : 0n);
      let brokerLast: bigint | undefined;
      const core = (
        brokerLastId: bigint | undefined,
        resent: number,
        reassigned: number,
        start: bigint,
      ): DedupPublisherCore => {
        const created = new DedupPublisherCore(
          transport,
          state!,
          ownedStore,
          options,
          start,
          meta?.reservedUpTo ?? 0n,
          {
            localLastId: localLast,
            brokerLastId,
            resent,
            reassigned,
          },
        );
        created.#outboxHigh = outboxHigh;
        return created;
      };
      try {
        brokerLast = await transport.connect({
          confirmed: (ids) => {
            if (handlersTarget.core !== undefined) handlersTarget.core.#onConfirmed(ids);
          },
          disconnected: (err) => {
            if (handlersTarget.core !== undefined) handlersTarget.core.#onDisconnected(err, 0);
          },
        });
      } catch (err) {
        throw asDedupError(
          err,
          'DEDUP_BROKER_UNREACHABLE',
          `cannot connect to the broker for "${transport.target}"`,
        );
      }
      const durability = options.durability ?? DEFAULTS.durability;
      if (idMode === 'keyed' && durability === 'reserve') {
        // A key's record is written before its message leaves. After a crash the record may name a
        // message that never reached the broker ('duplicate' to every re-send: a silent loss), or
        // one whose frames are still on their way from the dead process (forgetting the key and
        // re-sending it under a new ID lands it twice; the publisher model found that race). Only
        // the outbox ties the record to the message.
        throw new DedupError(
          'DEDUP_UNSAFE_OPTIONS',
          `idMode 'keyed' needs durability 'outbox': without it a crash can leave a key recorded whose message ` +
            `never reached the broker (lost) or is still on its way (published twice if the key is re-sent)`,
        );
      }
      if (idMode === 'explicit' && durability === 'reserve' && brokerLast === undefined) {
        // Without an outbox, explicit IDs resume after the broker's last ID (below): a broker that
        // cannot tell it would leave accepted messages that were never stored skipped by the source.
        throw new DedupError(
          'DEDUP_UNSAFE_OPTIONS',
          `idMode 'explicit' with durability 'reserve' needs the broker's last publishing ID to recover after a ` +
            `crash, and "${transport.target}" cannot report it (AMQP 0-9-1): use durability 'outbox'`,
        );
      }
      const outbox = loaded.segments.flatMap((s) => s.entries);
      const outboxLast = outbox.length > 0 ? outbox[outbox.length - 1]!.publishingId : 0n;
      let keySegments = idMode === 'keyed' ? await state.loadKeySegments() : [];
      if (
        idMode === 'keyed' &&
        brokerLast !== undefined &&
        brokerLast > 0n &&
        meta !== undefined &&
        meta.reservedUpTo > 0n &&
        meta.reservedUpTo >= meta.lastId
      ) {
        // Only a store whose last writer reserved keyed IDs (0.1 allowed keyed + reserve): its records
        // may name messages that never reached the broker. Records written with an outbox segment
        // never do, whatever the broker says (it under-reports a name it forgot).
        keySegments = await storeWrite(
          forgetUnstoredKeys(state, keySegments, maxId(brokerLast, outboxHigh), outbox),
        );
      }
      let publisher: DedupPublisherCore;
      if (brokerLast !== undefined && brokerLast > localLast) {
        if ((options.onBrokerAhead ?? 'error') === 'error') {
          throw new DedupError(
            'DEDUP_SEQUENCE_REGRESSION',
            `the broker's last publishing ID for producer "${options.producerName}" on "${transport.target}" is ${brokerLast}, ` +
              `above this store's ${localLast}. Either another process publishes under this name (names must be unique ` +
              `among live producers), or this store was lost, replaced or restored from a backup. Publishing now would ` +
              `reuse IDs the broker drops silently. Investigate, or open with onBrokerAhead: 'adopt' to continue above ` +
              `${brokerLast}${outbox.length > 0 ? ` (the ${outbox.length} outbox messages would be re-sent under new IDs)` : ''}.`,
          );
        }
        if (idMode === 'explicit' && outbox.length > 0) {
          // New IDs for them would be IDs the application's source means for other records.
          throw new DedupError(
            'DEDUP_SEQUENCE_REGRESSION',
            `the broker's last publishing ID for producer "${options.producerName}" on "${transport.target}" is ${brokerLast}, ` +
              `above this store's ${localLast}, and the outbox holds ${outbox.length} messages with application-supplied ` +
              `IDs at or below it: onBrokerAhead 'adopt' cannot give them new IDs. Investigate; use a new producer name ` +
              `or a new store to start over.`,
          );
        }
        publisher = core(brokerLast, 0, outbox.length, brokerLast);
        handlersTarget.core = publisher;
        publisher.#loadKeys(keySegments);
        // Their old IDs are at or below the broker's: re-send them as new messages above it. The old
        // segments go in the same store write as the new ones, whatever maxBatch is: a crash between
        // two writes would lose the messages whose old segment is gone and new one not yet written.
        const reassigned: Entry[] = [];
        for (const e of outbox) {
          const entry = publisher.#accept(e.body, e.headers, undefined, e.key);
          if (entry instanceof Error) throw entry;
          reassigned.push(entry);
        }
        if (reassigned.length > 0) {
          publisher.#segmentsToDelete.push(...loaded.segments.map((s) => s.firstId));
          await storeWrite(publisher.#commit(reassigned, true));
          for (const e of reassigned) publisher.#pending.push(e);
          publisher.#resendAll = true;
        }
      } else {
        // Explicit IDs resume where the application's source must go on: after every ID that is in
        // the stream (the broker's last) or will be re-sent from the outbox. Not the store's last
        // ID: without an outbox (now or in an earlier life) IDs above the broker's were accepted
        // but never stored, and the application must send them again.
        const resumeAt =
          idMode === 'explicit'
            ? brokerLast !== undefined
              ? maxId(brokerLast, outboxLast, outboxHigh)
              : (meta?.lastId ?? 0n)
            : localLast;
        publisher = core(brokerLast, outbox.length, 0, resumeAt);
        handlersTarget.core = publisher;
        if (idMode !== 'explicit' && meta !== undefined) {
          publisher.#declareSkip(meta, brokerLast, outboxLast, localLast);
        }
        publisher.#loadKeys(keySegments);
        for (const s of loaded.segments) {
          const segment: Segment = { firstId: s.firstId, remaining: s.entries.length };
          for (const e of s.entries) {
            const entry = new Entry(e.publishingId, e.body, e.headers, e.key);
            entry.segment = segment;
            const record = e.key === undefined ? undefined : publisher.#keys.get(e.key);
            if (record?.publishingId === e.publishingId) {
              record.inFlight = entry;
              entry.keyRecord = record;
            }
            publisher.#pending.push(entry);
          }
        }
        publisher.#resendAll = publisher.#pending.size > 0;
      }
      publisher.#startTimers();
      publisher.#schedulePump();
      return publisher;
    } catch (err) {
      // A core may exist already (adopting, a disconnect heard during open): stop its reconnect
      // loop before closing the transport, or a late reconnect would hold the name.
      const created = handlersTarget.core;
      if (created !== undefined) {
        created.#status = 'closing';
        created.#reconnectWake?.();
        await created.#reconnectLoop;
      }
      state?.release();
      await transport.close();
      await ownedStore?.close();
      throw err;
    }
  }

  /**
   * Automatic and keyed IDs resume above the reserved ceiling: after a crash in `reserve`
   * durability the rest of the block is never used. Those IDs are declared skipped on the next new
   * message, from the first one that no message in the stream or the outbox carries: above the
   * broker's last ID (or, where the broker cannot tell it, the store's last written ID) and the
   * outbox's. A skip an earlier life declared on a message that never reached the broker is
   * declared again (the store keeps it until that message is confirmed). When the store's last ID
   * is above its reserved ceiling, every ID up to it is in the stream or the outbox: no skip.
   */
  #declareSkip(
    meta: ProducerMeta,
    brokerLast: bigint | undefined,
    outboxLast: bigint,
    ceiling: bigint,
  ): void {
    let from: bigint | undefined;
    if (meta.reservedUpTo >= meta.lastId) {
      const used = maxId(brokerLast ?? meta.lastId, outboxLast);
      if (used < ceiling) from = used + 1n;
    }
    if (
      meta.skipFrom !== undefined &&
      meta.skipFrom <= ceiling &&
      (from === undefined || meta.skipFrom < from)
    ) {
      from = meta.skipFrom;
    }
    this.#skipToDeclare = from;
    // Written with the first commit, which comes before the first new ID leaves.
    this.#persistedSkipFrom = from;
  }

  /** Fills the in-memory key index from the store's key segments (later ones win). */
  #loadKeys(
    segments: ReadonlyArray<{ readonly firstId: bigint; readonly entries: readonly KeyEntry[] }>,
  ): void {
    for (const { firstId, entries } of segments) {
      const records = entries.map((e): LiveKey => ({
        key: e.key,
        publishingId: e.publishingId,
        createdAtMs: e.createdAtMs,
        inFlight: undefined,
      }));
      for (const record of records) this.#keys.set(record);
      const last = records[records.length - 1]!;
      this.#keySegments.push({ firstId, lastId: last.publishingId, newestMs: last.createdAtMs, records });
    }
  }

  /** The last publishing ID handed out (0n before the first). */
  get lastPublishingId(): bigint {
    return this.#lastAssigned;
  }

  /** Keyed mode: keys in the in-memory index (retained, or accepted and not yet committed). @internal */
  get keysInMemory(): number {
    return this.#keys.size;
  }

  /** Messages accepted and not yet confirmed. */
  get inFlight(): number {
    return (
      this.#waiting.length -
      this.#waitingHead +
      this.#batch.length +
      this.#committingCount +
      this.#pending.size
    );
  }

  /** True after `close()` or a fatal error. */
  get isClosed(): boolean {
    return this.#closeRequested || this.#status === 'closed';
  }

  /** Resolves when the publisher has closed: with the error that closed it, or `undefined` after `close()`. */
  closed(): Promise<DedupError | undefined> {
    return this.#closedPromise;
  }

  /** See `StreamDedupPublisher.send`. */
  send(body: Uint8Array, options: SendOptions = NO_OPTIONS): Promise<SendResult> {
    if (!(body instanceof Uint8Array)) {
      throw new TypeError(`body must be a Buffer or Uint8Array, got ${body === null ? 'null' : typeof body}`);
    }
    const headers = validateHeaders(options.headers);
    if (this.#fatal !== undefined) return Promise.reject(this.#fatal);
    if (this.#closeRequested || this.#status === 'closed') {
      return Promise.reject(
        new DedupError(
          'DEDUP_PUBLISHER_CLOSED',
          `publisher "${this.producerName}" is closed; nothing was sent`,
        ),
      );
    }
    const size = body.length + (headers === undefined ? 0 : headersSize(headers)) + this.#stampBytes;
    if (size > this.#transport.maxMessageBytes) {
      throw new RangeError(
        `message of about ${size} bytes exceeds the broker's limit of ${this.#transport.maxMessageBytes} bytes`,
      );
    }
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    let explicitId: bigint | undefined;
    if (this.idMode === 'explicit') {
      if (options.publishingId === undefined) {
        return Promise.reject(
          new DedupError(
            'DEDUP_ID_MODE_MISMATCH',
            `publisher "${this.producerName}" uses idMode 'explicit': every send() needs options.publishingId`,
          ),
        );
      }
      assertPublishingId(options.publishingId, 'options.publishingId');
      if (options.publishingId <= this.#lastAssigned) {
        return Promise.reject(
          new DedupError(
            'DEDUP_ID_REGRESSION',
            `publishingId ${options.publishingId} is not above the last accepted ${this.#lastAssigned} for producer ` +
              `"${this.producerName}": the broker would drop it and still confirm it (silent loss). Nothing was sent.`,
          ),
        );
      }
      explicitId = options.publishingId;
    } else if (options.publishingId !== undefined) {
      return Promise.reject(
        new DedupError(
          'DEDUP_ID_MODE_MISMATCH',
          `publisher "${this.producerName}" uses idMode '${this.idMode}': open it with idMode 'explicit' to pass publishingId`,
        ),
      );
    }
    if (this.idMode === 'keyed') {
      if (options.key === undefined) {
        return Promise.reject(
          new DedupError(
            'DEDUP_ID_MODE_MISMATCH',
            `publisher "${this.producerName}" uses idMode 'keyed': every send() needs options.key`,
          ),
        );
      }
      assertKey(options.key);
      return this.#sendKeyed(body, headers, options.key, signal);
    }
    if (options.key !== undefined) {
      return Promise.reject(
        new DedupError(
          'DEDUP_ID_MODE_MISMATCH',
          `publisher "${this.producerName}" uses idMode '${this.idMode}': open it with idMode 'keyed' to pass a key`,
        ),
      );
    }
    return this.#submit(body, headers, explicitId, undefined, signal);
  }

  /**
   * A keyed send: a key published before (and still retained) resolves with its original ID and
   * `outcome: 'duplicate'`, publishing nothing (once confirmed, if it is still in flight); a new
   * key is published under the next ID, and its record is written in the same group commit as
   * the message. The index is in memory: no read on the hot path.
   */
  #sendKeyed(
    body: Uint8Array,
    headers: Headers | undefined,
    key: string,
    signal: AbortSignal | undefined,
  ): Promise<SendResult> {
    const known = this.#keys.get(key);
    if (known !== undefined && this.#retained(known)) {
      this.counters.keyDuplicates++;
      const inFlight = known.inFlight;
      if (inFlight !== undefined) {
        return new Promise<SendResult>((resolve, reject) => {
          ((inFlight.extra ??= {}).keyWaiters ??= []).push({
            resolve: (publishingId) => resolve({ publishingId, outcome: 'duplicate' }),
            reject,
          });
        });
      }
      return Promise.resolve({ publishingId: known.publishingId, outcome: 'duplicate' });
    }
    return this.#submit(body, headers, undefined, key, signal);
  }

  /** The first send of a key settled: so do the repeats that waited for it. */
  #keySettled(entry: Entry, outcome: bigint | Error): void {
    if (entry.key === undefined) return;
    const record = entry.keyRecord;
    if (record?.inFlight === entry) record.inFlight = undefined;
    const waiters = entry.extra?.keyWaiters;
    if (waiters !== undefined) entry.extra!.keyWaiters = undefined;
    for (const w of waiters ?? []) {
      if (outcome instanceof Error) w.reject(outcome);
      else w.resolve(outcome);
    }
  }

  /** A keyed message that will never be written (aborted, closed): its key is free again. */
  #forgetKey(entry: Entry, error: Error): void {
    if (entry.key === undefined) return;
    if (entry.keyRecord !== undefined) this.#keys.delete(entry.key, entry.keyRecord);
    this.#keySettled(entry, error);
  }

  /** Whether a key's record is inside the retention (by count of later IDs, and by age). */
  #retained(record: KeyRecord): boolean {
    return (
      this.#lastAssigned - record.publishingId < BigInt(this.#keyRetention.maxKeys) &&
      Date.now() - record.createdAtMs <= this.#keyRetention.maxAgeMs
    );
  }

  /**
   * Drops key segments (and their keys) wholly past the retention; the deletes ride the next
   * commit. Runs before every keyed commit, so that memory holds about `maxKeys` keys (plus one
   * group commit's, and those accepted but not yet committed) at any rate, and every minute for the
   * age limit of an idle publisher.
   */
  #pruneKeys(): void {
    const oldestKept = this.#lastAssigned - BigInt(this.#keyRetention.maxKeys);
    const expiredBefore = Date.now() - this.#keyRetention.maxAgeMs;
    let n = 0;
    while (n < this.#keySegments.length) {
      const seg = this.#keySegments[n]!;
      if (seg.lastId > oldestKept && seg.newestMs >= expiredBefore) break;
      this.#keySegmentsToDelete.push(seg.firstId);
      n++;
    }
    if (n === 0) return;
    for (const seg of this.#keySegments.splice(0, n)) {
      // A key published again after it expired has a newer record: that one stays.
      for (const record of seg.records) this.#keys.delete(record.key, record);
    }
    this.#schedulePump();
  }

  /** A send of a message: its ID, its promise, its place in the queue. */
  #submit(
    body: Uint8Array,
    headers: Headers | undefined,
    explicitId: bigint | undefined,
    key: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<SendResult> {
    const prevAssigned = this.#lastAssigned;
    const entry = this.#accept(body, headers, explicitId, key);
    if (entry instanceof Error) return Promise.reject(entry);
    // One shared executor: no closure per send (see `captureSettlers`).
    const promise = new Promise<SendResult>(captureSettlers);
    entry.resolve = capturedResolve;
    entry.reject = capturedReject;
    if (signal !== undefined) {
      const onAbort = (): void => this.#abort(entry);
      entry.extra = { signal, onAbort, prevAssigned };
      signal.addEventListener('abort', onAbort, { once: true });
    }
    this.#enqueue(entry);
    return promise;
  }

  /** Assigns the ID (the next one, or the caller's) and, for a key, its record in the index. */
  #accept(
    body: Uint8Array,
    headers: Headers | undefined,
    explicitId: bigint | undefined,
    key: string | undefined,
  ): Entry | RangeError {
    const publishingId = explicitId ?? this.#lastAssigned + 1n;
    if (publishingId > MAX_PUBLISHING_ID) {
      return new RangeError(`publishing IDs of producer "${this.producerName}" are exhausted (2^64 - 1)`);
    }
    this.#lastAssigned = publishingId;
    if (this.#skipToDeclare !== undefined && explicitId === undefined) {
      headers = withSkip(headers, this.#skipToDeclare);
      this.#skipToDeclare = undefined;
      this.#skipDeclaringId = publishingId;
    }
    const entry = new Entry(publishingId, body, headers, key);
    if (key !== undefined) {
      const record: LiveKey = { key, publishingId, createdAtMs: Date.now(), inFlight: entry };
      this.#keys.set(record);
      entry.keyRecord = record;
    }
    return entry;
  }

  /** Queues an accepted message for the next group commit, or parks it while there is no room. */
  #enqueue(entry: Entry): void {
    if (this.#waiting.length > this.#waitingHead || this.inFlight >= this.#opts.maxInFlight) {
      this.#waiting.push(entry);
    } else {
      this.#batch.push(entry);
      this.#schedulePump();
    }
  }

  #abort(entry: Entry): void {
    const extra = entry.extra!;
    const error = abortError(extra.signal!);
    const i = this.#waiting.indexOf(entry, this.#waitingHead);
    // Still waiting for room, and nobody else waits for it (repeats of its key that passed no
    // signal): it never reaches the store or the wire, and its key is free again. When its ID is
    // the last handed out, the next send gets it (explicit IDs: the caller may send it again).
    if (i >= 0 && (extra.keyWaiters?.length ?? 0) === 0) {
      this.#waiting.splice(i, 1);
      this.#forgetKey(entry, error);
      if (this.idMode === 'explicit') {
        // The caller's IDs: only the last can be handed back (an earlier one is below later IDs).
        if (entry.publishingId === this.#lastAssigned && extra.prevAssigned !== undefined) {
          this.#lastAssigned = extra.prevAssigned;
        }
      } else {
        // Automatic and keyed IDs of sends still waiting are unwritten, unsent and unseen by any
        // caller: the later ones move down, so an abort leaves no hole in the stream.
        this.#renumberFrom(i, entry);
      }
    }
    // Otherwise the message may be published anyway; only the caller stops waiting.
    this.#settle(entry, error);
  }

  /** Closes the hole an aborted waiting entry leaves at `#waiting[i]` (it was taken out). */
  #renumberFrom(i: number, aborted: Entry): void {
    let id = aborted.publishingId;
    const declares = this.#skipDeclaringId === id;
    for (let j = i; j < this.#waiting.length; j++) {
      const e = this.#waiting[j]!;
      const next = e.publishingId;
      e.publishingId = id;
      if (e.keyRecord !== undefined && e.keyRecord.inFlight === e) e.keyRecord.publishingId = id;
      id = next;
    }
    this.#lastAssigned = id - 1n;
    if (!declares) return;
    // The skip (pending in the store until its declaration is confirmed) moves to the entry that
    // now has the aborted one's ID, or waits for the next send.
    const from = this.#persistedSkipFrom!;
    const heir = this.#waiting[i];
    if (heir === undefined) {
      this.#skipToDeclare = from;
      this.#skipDeclaringId = undefined;
    } else {
      heir.headers = withSkip(heir.headers, from);
    }
  }

  #settle(entry: Entry, outcome: Error | SendResult): void {
    const { resolve, reject } = entry;
    entry.resolve = undefined;
    entry.reject = undefined;
    const extra = entry.extra;
    if (extra?.onAbort !== undefined) {
      extra.signal?.removeEventListener('abort', extra.onAbort);
      extra.onAbort = undefined;
    }
    if (outcome instanceof Error) reject?.(outcome);
    else resolve?.(outcome);
  }

  #schedulePump(): void {
    if (this.#pumping || this.#pumpScheduled) return;
    this.#pumpScheduled = true;
    // setImmediate, not a microtask: sends made in the same tick join one group commit.
    setImmediate(() => {
      this.#pumpScheduled = false;
      void this.#pump();
    });
  }

  /**
   * The only place that writes the store and hands messages to the transport, one step at a
   * time, so that the wire sees IDs in increasing order.
   */
  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    let batch: Entry[] = [];
    try {
      for (;;) {
        // Once close() stopped waiting, nothing is written or sent: close() writes what is left,
        // and after it nothing may touch the store (a shared store may hold a newer life's state).
        if (this.#fatal !== undefined || this.#status === 'closing' || this.#status === 'closed') break;
        if (this.#resendAll && this.#status !== 'reconnecting') {
          this.#resendAll = false;
          const all = [...this.#pending.values()];
          this.counters.resent += all.length;
          await this.#publish(all);
          continue;
        }
        if (
          this.#batch.length === 0 &&
          this.#segmentsToDelete.length === 0 &&
          this.#keySegmentsToDelete.length === 0 &&
          !this.#metaDirty
        ) {
          break;
        }
        batch =
          this.#batch.length <= this.#opts.maxBatch ? this.#batch : this.#batch.slice(0, this.#opts.maxBatch);
        this.#batch = batch === this.#batch ? [] : this.#batch.slice(batch.length);
        this.#committingCount = batch.length;
        try {
          await this.#commit(batch);
        } catch (err) {
          this.#committingCount = 0;
          this.#fail(asDedupError(err, 'DEDUP_STORE_CORRUPT', 'writing the store failed'), batch);
          break;
        }
        this.#committingCount = 0;
        for (const e of batch) this.#pending.push(e);
        // After a reconnect the whole pending set (this batch included) goes out first, in ID
        // order: publishing this batch ahead of older re-sends would make the broker drop them.
        // A publisher closing meanwhile keeps the batch in the outbox and sends nothing more.
        if (batch.length > 0 && this.#status === 'open' && !this.#resendAll) await this.#publish(batch);
        batch = [];
        this.#refill();
      }
    } catch (err) {
      // Nothing here may reject unhandled (the pump runs from a timer): a broken invariant stops
      // the publisher with an error its callers see; the outbox keeps what it holds.
      this.#committingCount = 0;
      this.#fail(
        new DedupError(
          'DEDUP_PUBLISHER_CLOSED',
          `publisher "${this.producerName}" stopped on an internal error (please report it): ${
            err instanceof Error ? err.message : String(err)
          }`,
          { cause: err },
        ),
        batch,
      );
    } finally {
      this.#pumping = false;
      for (const wake of this.#idle.splice(0)) wake();
    }
  }

  /**
   * Writes one group commit. `asOutbox` writes the batch as an outbox segment whatever the
   * durability (the messages `open()` re-assigns: their old segments go in the same write).
   */
  async #commit(batch: readonly Entry[], asOutbox = this.durability === 'outbox'): Promise<void> {
    if (this.idMode === 'keyed') this.#pruneKeys();
    const deleteSegments = this.#segmentsToDelete;
    this.#segmentsToDelete = [];
    const deleteKeySegments = this.#keySegmentsToDelete;
    this.#keySegmentsToDelete = [];
    let keys: LiveKey[] | undefined;
    if (this.idMode === 'keyed') {
      keys = [];
      for (const e of batch) {
        // Every keyed entry got its record when it was accepted (#accept).
        if (e.keyRecord !== undefined) keys.push(e.keyRecord);
      }
      if (keys.length > 0) {
        this.#keySegments.push({
          firstId: keys[0]!.publishingId,
          lastId: keys[keys.length - 1]!.publishingId,
          newestMs: keys[keys.length - 1]!.createdAtMs,
          records: keys,
        });
      }
    }
    const last = batch.length > 0 ? batch[batch.length - 1]!.publishingId : this.#lastDurable;
    if (asOutbox) {
      let segment: Segment | undefined;
      if (batch.length > 0) {
        segment = { firstId: batch[0]!.publishingId, remaining: batch.length };
        for (const e of batch) e.segment = segment;
      }
      if (last > this.#outboxHigh) this.#outboxHigh = last;
      const meta: ProducerMeta = {
        idMode: this.idMode,
        lastId: last,
        reservedUpTo: this.#reservedUpTo,
        skipFrom: this.#persistedSkipFrom,
        outboxHigh: this.#outboxHigh,
      };
      this.#metaDirty = false;
      await this.#state.commit({ meta, segment: batch, deleteSegments, keys, deleteKeySegments });
      this.#lastDurable = last;
    } else if (
      last > this.#reservedUpTo ||
      deleteSegments.length > 0 ||
      deleteKeySegments.length > 0 ||
      (keys !== undefined && keys.length > 0) ||
      this.#metaDirty
    ) {
      // Reserve a block past the batch before any of it leaves, so a restart skips it all. With
      // explicit IDs nothing is skipped (the caller chooses the IDs, and resumes after the broker's
      // last one): the block is the ceiling that open() checks the broker against, and an ID above
      // it takes a new one. One write per block rather than per batch: a LevelDB round trip in
      // every batch held up the pump (explicit IDs ran at 0.92 of the raw client where automatic
      // IDs ran at 1.02, in one bench:publish run; 0.98-1.05 with blocks).
      const reservedUpTo =
        last > this.#reservedUpTo ? last + BigInt(this.#opts.reserveBlock) : this.#reservedUpTo;
      const capped = reservedUpTo > MAX_PUBLISHING_ID ? MAX_PUBLISHING_ID : reservedUpTo;
      // Automatic IDs record the last ID below every unconfirmed or unsent one: where the broker
      // cannot tell its last ID (AMQP 0-9-1) the next life declares its skip from just above it,
      // so that a message lost on the wire at a crash falls inside the declared range.
      const lowest = this.#pending.first?.publishingId ?? batch[0]?.publishingId;
      const lastId = this.idMode === 'explicit' || lowest === undefined || lowest > last ? last : lowest - 1n;
      this.#metaDirty = false;
      await this.#state.commit({
        meta: {
          idMode: this.idMode,
          lastId,
          reservedUpTo: capped,
          skipFrom: this.#persistedSkipFrom,
          outboxHigh: this.#outboxHigh,
        },
        deleteSegments,
        keys,
        deleteKeySegments,
      });
      this.#reservedUpTo = capped;
      this.#lastDurable = last;
    }
  }

  async #publish(entries: readonly Entry[]): Promise<void> {
    if (entries.length === 0) return;
    const epoch = this.#epoch;
    // Whole milliseconds (at least 1): a small integer, not a number boxed in every entry.
    const now = Math.ceil(performance.now()) || 1;
    for (const e of entries) e.sentAt = now;
    this.counters.sent += entries.length;
    try {
      // Entries are OutgoingMessages already: the transport stamps the identity itself.
      await this.#transport.publish(entries);
    } catch (err) {
      this.#onDisconnected(err instanceof Error ? err : new Error(String(err)), epoch);
    }
  }

  #takeWaiting(): Entry[] {
    const taken = this.#waiting.slice(this.#waitingHead);
    this.#waiting = [];
    this.#waitingHead = 0;
    return taken;
  }

  /** Moves parked sends into the batch while there is room. */
  #refill(): void {
    let moved = false;
    while (
      this.#waiting.length > this.#waitingHead &&
      this.#batch.length + this.#committingCount + this.#pending.size < this.#opts.maxInFlight
    ) {
      this.#batch.push(this.#waiting[this.#waitingHead++]!);
      moved = true;
    }
    if (this.#waitingHead > 1024 && this.#waitingHead * 2 > this.#waiting.length) {
      this.#waiting = this.#waiting.slice(this.#waitingHead);
      this.#waitingHead = 0;
    }
    if (moved) this.#schedulePump();
  }

  #onConfirmed(ids: readonly bigint[]): void {
    for (const id of ids) {
      const e = this.#pending.take(id);
      if (e === undefined) continue;
      if (e.segment !== undefined && --e.segment.remaining === 0)
        this.#segmentsToDelete.push(e.segment.firstId);
      if (e.key !== undefined) this.#keySettled(e, id);
      if (id === this.#skipDeclaringId) {
        // The skip is in the stream: the store no longer needs to remember it.
        this.#skipDeclaringId = undefined;
        this.#persistedSkipFrom = undefined;
        this.#metaDirty = true;
      }
      this.counters.confirmed++;
      this.#settle(e, { publishingId: id, outcome: 'published' });
    }
    this.#refill();
    if (this.#segmentsToDelete.length > 0 || this.#metaDirty) this.#schedulePump();
    if (this.inFlight === 0) for (const wake of this.#idle.splice(0)) wake();
  }

  #onDisconnected(error: Error, epoch: number): void {
    if (epoch !== this.#epoch || this.#status !== 'open' || this.#fatal !== undefined) return;
    this.#status = 'reconnecting';
    this.#epoch++;
    this.#log.warn(
      { producer: this.producerName, target: this.#transport.target, err: error },
      'stream-dedup: connection lost; reconnecting',
    );
    this.#reconnectLoop = this.#reconnect(error);
  }

  async #reconnect(_cause: Error): Promise<void> {
    const started = performance.now();
    let delay = this.#opts.initialDelayMs;
    while (this.#status === 'reconnecting') {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, delay * (0.5 + Math.random() / 2));
        this.#reconnectWake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.#reconnectWake = undefined;
      if (this.#status !== 'reconnecting') return;
      const epoch = this.#epoch;
      try {
        const brokerLast = await this.#transport.connect({
          // Confirms from any connection count: the broker stored (or had) those IDs.
          confirmed: (ids) => this.#onConfirmed(ids),
          disconnected: (err) => this.#onDisconnected(err, epoch),
        });
        // Closing meanwhile: close() closes this connection once this loop has returned.
        if (this.#status !== 'reconnecting') return;
        if (brokerLast !== undefined && brokerLast > this.#ownCeiling()) {
          this.#fail(this.#nameConflict(brokerLast));
          return;
        }
        // Everything unconfirmed goes out again, in ID order, with its original ID; the broker drops
        // (and confirms) what it already stored.
        this.#status = 'open';
        this.#resendAll = true;
        this.counters.reconnects++;
        this.#log.info(
          {
            producer: this.producerName,
            target: this.#transport.target,
            brokerLastId: brokerLast?.toString(),
            resend: this.#pending.size,
          },
          'stream-dedup: reconnected; re-sending unconfirmed messages',
        );
        this.#schedulePump();
        return;
      } catch (err) {
        if (performance.now() - started > this.#opts.giveUpAfterMs) {
          // Whatever the last attempt failed at (connecting, or declaring the producer, as on a
          // shared client whose connection is gone), giving up is one condition with one code.
          this.#fail(
            new DedupError(
              'DEDUP_BROKER_UNREACHABLE',
              `no connection to the broker for ${Math.round(this.#opts.giveUpAfterMs / 1000)} s; ` +
                `${this.inFlight} unconfirmed messages stay in the outbox for the next open(). ` +
                `Last attempt: ${err instanceof Error ? err.message : String(err)}`,
              { cause: err },
            ),
          );
          return;
        }
        delay = Math.min(delay * 2, this.#opts.maxDelayMs);
      }
    }
  }

  /**
   * The highest ID this producer may have used: what it handed out, or the block an earlier life
   * reserved. Explicit IDs in reserve durability resume at the broker's last ID, and frames a dead
   * process left on the way can land after that (up to its reserved ceiling): not another writer.
   */
  #ownCeiling(): bigint {
    return this.#lastAssigned > this.#reservedUpTo ? this.#lastAssigned : this.#reservedUpTo;
  }

  #nameConflict(brokerLast: bigint): DedupError {
    return new DedupError(
      'DEDUP_NAME_CONFLICT',
      `the broker's last publishing ID for producer "${this.producerName}" on "${this.#transport.target}" is ${brokerLast}, ` +
        `above the ${this.#ownCeiling()} this publisher handed out or reserved: another writer publishes under this name, and the ` +
        `broker drops whichever of the two is behind. Stopped; unconfirmed messages stay in the outbox.`,
    );
  }

  #startTimers(): void {
    this.#unobserve = observePublisher(this.counters, this.producerName, this.#transport.target);
    this.#log.info(
      {
        producer: this.producerName,
        target: this.#transport.target,
        localLastId: this.report.localLastId.toString(),
        brokerLastId: this.report.brokerLastId?.toString(),
        resent: this.report.resent,
        reassigned: this.report.reassigned,
      },
      'stream-dedup: publisher open',
    );
    const interval = Math.max(50, Math.min(1_000, Math.floor(this.#opts.confirmTimeoutMs / 4)));
    this.#timer = setInterval(() => this.#checkTimeouts(), interval);
    this.#timer.unref();
    if (this.idMode === 'keyed') {
      // Keys past the retention leave memory and the store: on open, then every minute.
      this.#pruneKeys();
      this.#pruneTimer = setInterval(() => this.#pruneKeys(), 60_000);
      this.#pruneTimer.unref();
    }
    if (this.#opts.watchIntervalMs > 0) {
      this.#watchTimer = setInterval(() => void this.#watch(), this.#opts.watchIntervalMs);
      this.#watchTimer.unref();
    }
  }

  #checkTimeouts(): void {
    if (this.#status !== 'open') return;
    const deadline = performance.now() - this.#opts.confirmTimeoutMs;
    let expired = 0;
    for (const e of this.#pending.values()) {
      if (e.sentAt === 0 || e.sentAt > deadline) break;
      // Every stalled message counts, also those recovered from the outbox and those whose caller
      // was already told: a connection that stops confirming only them must be replaced too.
      expired++;
      if (e.reject === undefined) continue;
      this.#settle(
        e,
        new DedupError(
          'DEDUP_CONFIRM_TIMEOUT',
          `publishing ID ${e.publishingId} of producer "${this.producerName}" was not confirmed within ` +
            `${this.#opts.confirmTimeoutMs} ms. It stays in the outbox and is re-sent with the same ID; ` +
            `do not send it again yourself (a new send gets a new ID).`,
        ),
      );
    }
    // A connection that stops confirming is treated as lost: reconnect and re-send.
    if (expired > 0) {
      this.#log.warn({ producer: this.producerName, expired }, 'stream-dedup: confirms timed out');
      this.#onDisconnected(new Error('confirm timeout'), this.#epoch);
    }
  }

  async #watch(): Promise<void> {
    if (this.#status !== 'open') return;
    try {
      const brokerLast = await this.#transport.queryLastId();
      if (brokerLast !== undefined && brokerLast > this.#ownCeiling() && this.#status === 'open') {
        this.#fail(this.#nameConflict(brokerLast));
      }
    } catch {
      // A failed query is the reconnect logic's business, not the watch's.
    }
  }

  /** Stops for good: every waiting send rejects with `error`; the outbox keeps unconfirmed messages. */
  #fail(error: DedupError, extra: readonly Entry[] = []): void {
    if (this.#fatal !== undefined) return;
    this.#fatal = error;
    this.#log.error(
      { producer: this.producerName, target: this.#transport.target, err: error },
      'stream-dedup: publisher stopped',
    );
    for (const e of [...extra, ...this.#takeWaiting(), ...this.#batch.splice(0), ...this.#pending.values()]) {
      this.#keySettled(e, error);
      this.#settle(e, error);
    }
    this.#pending.clear();
    void this.close();
  }

  /**
   * Waits (up to `closeTimeoutMs`) for outstanding confirms, frees the name on the broker,
   * releases the store. Sends still unconfirmed then reject with `DEDUP_PUBLISHER_CLOSED` and stay
   * in the outbox. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= this.#doClose();
    return this.#closing;
  }

  async #doClose(): Promise<void> {
    this.#closeRequested = true;
    const deadline = performance.now() + this.#opts.closeTimeoutMs;
    if (this.#fatal === undefined) {
      // Let accepted sends finish (reconnecting if need be): parked ones move on as confirms free room.
      while (this.inFlight > 0 && performance.now() < deadline && this.#fatal === undefined) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, Math.max(1, deadline - performance.now()));
          this.#idle.push(() => {
            clearTimeout(t);
            resolve();
          });
        });
      }
    }
    this.#status = 'closing';
    this.#reconnectWake?.();
    clearInterval(this.#timer);
    clearInterval(this.#watchTimer);
    clearInterval(this.#pruneTimer);
    this.#unobserve();
    // A group commit being written finishes first: its messages are then in the outbox.
    while (this.#pumping) await new Promise<void>((resolve) => this.#idle.push(resolve));
    const unwritten = new DedupError(
      'DEDUP_PUBLISHER_CLOSED',
      `publisher "${this.producerName}" closed before this message was written or sent: nothing was sent, ` +
        `and nothing will re-send it`,
    );
    const unconfirmed = new DedupError(
      'DEDUP_PUBLISHER_CLOSED',
      this.durability === 'outbox'
        ? `publisher "${this.producerName}" closed before the broker confirmed this message; it stays in the ` +
            `outbox and is re-sent with its ID by the next open() of this producer`
        : `publisher "${this.producerName}" closed before the broker confirmed this message; with reserve ` +
            `durability it is not re-sent: it may or may not be in the stream`,
    );
    let unsent = [...this.#batch.splice(0), ...this.#takeWaiting()];
    if (unsent.length > 0 && this.durability === 'outbox' && this.#fatal === undefined) {
      // Accepted sends are not dropped: one last group commit puts them in the outbox, and the
      // next open() sends them.
      try {
        await this.#commit(unsent);
        for (const e of unsent) this.#pending.push(e);
        unsent = [];
      } catch {
        // Not written: they are reported as never sent.
      }
    }
    for (const e of unsent) {
      const error = this.#fatal ?? unwritten;
      this.#forgetKey(e, error);
      this.#settle(e, error);
    }
    for (const e of this.#pending.values()) {
      const error = this.#fatal ?? unconfirmed;
      this.#keySettled(e, error);
      this.#settle(e, error);
    }
    // Delete segments confirmed since the last commit (a reserve life that recovered an outbox has
    // them too), so the next open re-sends less; and forget a skip whose declaration was confirmed.
    if (this.#segmentsToDelete.length > 0 || this.#metaDirty) {
      await this.#commit([]).catch(() => undefined);
    }
    // A reconnect attempt in progress may still open a connection: let it finish, then close it.
    await this.#reconnectLoop;
    await this.#transport.close();
    this.#state.release();
    await this.#ownedStore?.close();
    this.#status = 'closed';
    this.#resolveClosed(this.#fatal);
  }
}

/**
 * Keyed sends: drops the records of keys whose message is neither in the stream (its ID is above
 * the broker's last) nor in the outbox. Without an outbox a key's record is written before its
 * message leaves, so a crash can leave a record whose message never reached the broker; kept, it
 * would answer the application's re-send of the key with 'duplicate' and publish nothing. The
 * store is rewritten in one write before anything is sent, so a crash here leaves either state.
 */
async function forgetUnstoredKeys(
  state: ProducerState,
  segments: ReadonlyArray<{ readonly firstId: bigint; readonly entries: readonly KeyEntry[] }>,
  brokerLast: bigint,
  outbox: readonly { readonly publishingId: bigint }[],
): Promise<Array<{ readonly firstId: bigint; readonly entries: readonly KeyEntry[] }>> {
  const inOutbox = new Set(outbox.map((e) => e.publishingId));
  const kept: Array<{ readonly firstId: bigint; readonly entries: readonly KeyEntry[] }> = [];
  const deletes: bigint[] = [];
  const puts: KeyEntry[][] = [];
  for (const segment of segments) {
    const entries = segment.entries.filter(
      (e) => e.publishingId <= brokerLast || inOutbox.has(e.publishingId),
    );
    if (entries.length === segment.entries.length) {
      kept.push(segment);
      continue;
    }
    deletes.push(segment.firstId);
    if (entries.length > 0) {
      puts.push(entries);
      kept.push({ firstId: entries[0]!.publishingId, entries });
    }
  }
  if (deletes.length > 0) await state.rewriteKeySegments(deletes, puts);
  return kept;
}

/** A store write during open(): its failure as the typed error the publisher reports for one. */
async function storeWrite<T>(write: Promise<T>): Promise<T> {
  try {
    return await write;
  } catch (err) {
    throw asDedupError(err, 'DEDUP_STORE_CORRUPT', 'writing the store failed');
  }
}

function maxId(...ids: bigint[]): bigint {
  return ids.reduce((a, b) => (b > a ? b : a), 0n);
}

function validateOptions(options: DedupPublisherOptions): void {
  if (typeof options !== 'object' || options === null) throw new TypeError('options must be an object');
  assertProducerName(options.producerName);
  if (typeof options.store !== 'string' && !(options.store instanceof DedupStore)) {
    throw new TypeError('store must be a folder path or an opened DedupStore');
  }
  if (
    options.durability !== undefined &&
    options.durability !== 'outbox' &&
    options.durability !== 'reserve'
  ) {
    throw new RangeError(`durability must be 'outbox' or 'reserve', got ${String(options.durability)}`);
  }
  if (options.idMode !== undefined && !['auto', 'explicit', 'keyed'].includes(options.idMode)) {
    throw new RangeError(`idMode must be 'auto', 'explicit' or 'keyed', got ${String(options.idMode)}`);
  }
  if (
    options.onBrokerAhead !== undefined &&
    options.onBrokerAhead !== 'error' &&
    options.onBrokerAhead !== 'adopt'
  ) {
    throw new RangeError(`onBrokerAhead must be 'error' or 'adopt', got ${String(options.onBrokerAhead)}`);
  }
}

/** The caller's headers (a copy, or none) with the skip declaration added. */
function withSkip(headers: Headers | undefined, from: bigint): Headers {
  const copy = Object.create(null) as Record<string, string | number>;
  if (headers !== undefined) for (const k of Object.keys(headers)) copy[k] = headers[k]!;
  copy[SKIP_HEADER] = from.toString();
  return copy;
}

/** The longest domain key, in UTF-8 bytes. */
export const MAX_KEY_BYTES = 512;

/**
 * Checks a domain key: a non-empty string of at most {@link MAX_KEY_BYTES} UTF-8 bytes without a
 * lone UTF-16 surrogate, in one pass over it (keyed sends call this for every message).
 * @internal Exported for its tests.
 */
export function assertKey(key: unknown): asserts key is string {
  if (typeof key !== 'string') throw new TypeError(`options.key must be a string, got ${typeof key}`);
  if (key.length === 0) throw new RangeError('options.key must not be empty');
  const { bytes, loneSurrogate } = measureUtf8(key);
  if (bytes > MAX_KEY_BYTES) {
    throw new RangeError(`options.key is ${bytes} UTF-8 bytes; at most ${MAX_KEY_BYTES}`);
  }
  // LevelDB stores keys as UTF-8, where every lone surrogate becomes U+FFFD: two distinct keys
  // would collide, and the second would be dropped as a duplicate.
  if (loneSurrogate) throw new RangeError('options.key must not contain a lone UTF-16 surrogate');
}

/**
 * Checks the caller's headers and returns a copy: the message is encoded later (after its group
 * commit), and the caller may reuse and change its object meanwhile. The copy has no prototype, so
 * a `__proto__` header is an ordinary key.
 */
function validateHeaders(headers: SendOptions['headers']): Headers | undefined {
  if (headers === undefined) return undefined;
  if (typeof headers !== 'object' || headers === null || Array.isArray(headers)) {
    throw new TypeError('options.headers must be an object of string or number values');
  }
  let copy: Record<string, string | number> | undefined;
  for (const [k, v] of Object.entries(headers)) {
    if (k.startsWith(RESERVED_PREFIX)) {
      throw new RangeError(
        `header ${k} is reserved: stream-dedup stamps ${PRODUCER_HEADER} and ${ID_HEADER} itself`,
      );
    }
    // What survives to every consumer: rabbitmq-stream-js-client 1.0's decoder throws inside its
    // socket handler on an empty string, a zero, or anything but a 32-bit integer.
    if (typeof v === 'string') {
      if (v.length === 0) throw new RangeError(`header ${k} must not be an empty string`);
    } else if (typeof v === 'number') {
      if (!Number.isInteger(v) || v === 0 || v < -0x8000_0000 || v > 0x7fff_ffff) {
        throw new RangeError(`header ${k} must be a non-zero 32-bit integer (or a string), got ${v}`);
      }
    } else {
      throw new TypeError(`header ${k} must be a string or a number, got ${typeof v}`);
    }
    copy ??= Object.create(null) as Record<string, string | number>;
    copy[k] = v;
  }
  return copy;
}

function headersSize(headers: Headers | undefined): number {
  if (headers === undefined) return 0;
  let n = 0;
  for (const [k, v] of Object.entries(headers)) n += Buffer.byteLength(k) + Buffer.byteLength(String(v)) + 8;
  return n;
}

function abortError(signal: AbortSignal): DedupError {
  return new DedupError('DEDUP_ABORTED', 'the wait was aborted; the message may still be published', {
    cause: signal.reason,
  });
}

function asDedupError(err: unknown, code: DedupError['code'], message: string): DedupError {
  if (err instanceof DedupError) return err;
  const detail = err instanceof Error ? err.message : String(err);
  return new DedupError(code, `${message}: ${detail}`, { cause: err });
}
