/**
 * Metrics through `@opentelemetry/api`: a no-op unless the application installs an OpenTelemetry
 * SDK with a MeterProvider. Every instrument is observable (read from counters the publisher and
 * consumer keep anyway), so the hot paths never call into OpenTelemetry.
 *
 * | name | unit | attributes | what |
 * |---|---|---|---|
 * | `stream_dedup.publisher.sent` | `{message}` | `producer`, `target` | messages handed to the broker, re-sends included |
 * | `stream_dedup.publisher.confirmed` | `{message}` | `producer`, `target` | messages the broker confirmed |
 * | `stream_dedup.publisher.resent` | `{message}` | `producer`, `target` | outbox messages re-sent on open and after reconnects |
 * | `stream_dedup.publisher.key_duplicates` | `{message}` | `producer`, `target` | keyed sends answered as duplicates (nothing published) |
 * | `stream_dedup.publisher.reconnects` | `{reconnect}` | `producer`, `target` | successful reconnects |
 * | `stream_dedup.verifier.outcomes` | `{message}` | `consumer`, `stream`, `outcome` (`new`, `duplicate`, `stale`, `unidentified`) | verdicts |
 * | `stream_dedup.verifier.gaps` | `{gap}` | `consumer`, `stream`, `confirmed` (`true`, `false`) | gaps reported (`false`) and confirmed (`true`): possibly lost |
 * | `stream_dedup.verifier.skips` | `{skip}` | `consumer`, `stream` | skip declarations seen: IDs a producer never used, not a loss (since 0.2.0) |
 * | `stream_dedup.verifier.commits` | `{commit}` | `consumer`, `stream` | batches committed |
 * | `stream_dedup.publisher.in_flight` (gauge) | `{message}` | `producer`, `target` | accepted, not yet confirmed (parked included) |
 * | `stream_dedup.publisher.outbox` (gauge) | `{message}` | `producer`, `target` | written and sent, not yet confirmed (outbox mode: the outbox's depth) |
 * | `stream_dedup.publisher.parked` (gauge) | `{message}` | `producer`, `target` | waiting for room under `maxInFlight` |
 * | `stream_dedup.publisher.confirm_latency` (histogram) | `ms` | `producer`, `target` | from the message's (last) hand-over to the transport to its confirm |
 * | `stream_dedup.verifier.commit_duration` (histogram) | `ms` | `consumer`, `stream` | a batch's write: effects, verifier state and offset |
 * | `stream_dedup.verifier.lag` (gauge) | `{offset}` | `consumer`, `stream` | offsets to the first of the stream's last chunk (a lower bound); a group member: `consumer` = the group, `stream` = each partition it holds |
 * | `stream_dedup.group.restore_duration` (histogram) | `ms` | `group`, `partition` | a partition's restore from its changelog on assignment |
 *
 * A verifier's `consumer` is its name — a group member's is the group's, with one series per partition
 * it holds (`stream`); `stream` is the stream, queue or partition read (since 0.6.0).
 *
 * Counters are per process life (they restart at 0 on open); Prometheus' `rate()` and
 * `increase()` handle such resets.
 */
import {
  metrics,
  type Attributes,
  type BatchObservableCallback,
  type Histogram,
  type Meter,
  type MeterProvider,
  type Observable,
} from '@opentelemetry/api';
import { libraryVersion } from './version.js';

/**
 * Instruments are made on first use from the global MeterProvider of that moment (the API has no
 * proxy for metrics): an SDK installed before the first publisher or consumer opens is used.
 */
function makeInstruments(meter: Meter) {
  const counter = (name: string, unit: string, description: string): Observable =>
    meter.createObservableCounter(name, { unit, description });
  const gauge = (name: string, unit: string, description: string): Observable =>
    meter.createObservableGauge(name, { unit, description });
  const histogram = (name: string, description: string): Histogram =>
    meter.createHistogram(name, {
      unit: 'ms',
      description,
      advice: { explicitBucketBoundaries: [1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000] },
    });
  return {
    meter,
    publisher: {
      sent: counter(
        'stream_dedup.publisher.sent',
        '{message}',
        'Messages handed to the broker, re-sends included',
      ),
      confirmed: counter('stream_dedup.publisher.confirmed', '{message}', 'Messages the broker confirmed'),
      resent: counter(
        'stream_dedup.publisher.resent',
        '{message}',
        'Outbox messages re-sent on open and after reconnects',
      ),
      keyDuplicates: counter(
        'stream_dedup.publisher.key_duplicates',
        '{message}',
        'Keyed sends answered as duplicates; nothing was published',
      ),
      reconnects: counter('stream_dedup.publisher.reconnects', '{reconnect}', 'Successful reconnects'),
      inFlight: gauge('stream_dedup.publisher.in_flight', '{message}', 'Sends accepted, not yet confirmed'),
      outbox: gauge(
        'stream_dedup.publisher.outbox',
        '{message}',
        'Messages written and sent, not yet confirmed (the outbox in outbox mode)',
      ),
      parked: gauge('stream_dedup.publisher.parked', '{message}', 'Sends waiting for room under maxInFlight'),
    },
    verifier: {
      outcomes: counter('stream_dedup.verifier.outcomes', '{message}', 'Verifier verdicts by outcome'),
      gaps: counter(
        'stream_dedup.verifier.gaps',
        '{gap}',
        'Gaps reported (confirmed=false) and confirmed (confirmed=true)',
      ),
      skips: counter(
        'stream_dedup.verifier.skips',
        '{skip}',
        'Skip declarations seen: IDs a producer declared it never used, not a loss',
      ),
      commits: counter('stream_dedup.verifier.commits', '{commit}', 'LevelDB batches committed'),
    },
    lag: gauge(
      'stream_dedup.verifier.lag',
      '{offset}',
      "Offsets from the committed one to the first of the stream's last chunk (a lower bound)",
    ),
    histograms: {
      confirmLatency: histogram(
        'stream_dedup.publisher.confirm_latency',
        "From a message's (last) hand-over to the transport to its confirm",
      ),
      commitDuration: histogram(
        'stream_dedup.verifier.commit_duration',
        "A batch's write: effects, verifier state and offset",
      ),
      restoreDuration: histogram(
        'stream_dedup.group.restore_duration',
        "A partition's store restored from its changelog, on assignment",
      ),
    },
  };
}

let cached: { provider: MeterProvider; instruments: ReturnType<typeof makeInstruments> } | undefined;

function instruments(): ReturnType<typeof makeInstruments> {
  const provider = metrics.getMeterProvider();
  if (cached?.provider !== provider) {
    cached = { provider, instruments: makeInstruments(provider.getMeter('stream-dedup', libraryVersion())) };
  }
  return cached.instruments;
}

/** What a publisher counts (its `stats`, since it opened; also the `stream_dedup.publisher.*` metrics). */
export interface PublisherCounters {
  /** Messages handed to the broker, re-sends included. */
  sent: number;
  /** Messages the broker confirmed. */
  confirmed: number;
  /** Outbox messages re-sent with their original IDs: on open and after reconnects. */
  resent: number;
  /** Keyed sends answered as duplicates (`outcome: 'duplicate'`): nothing was published. */
  keyDuplicates: number;
  /** Successful reconnects after a lost connection. */
  reconnects: number;
}

/** What a verifying consumer counts (its `stats`; also the `stream_dedup.verifier.*` metrics). */
export interface VerifierCounters {
  /** New messages: the handler ran and the ID was recorded. */
  readonly new: number;
  /** Messages skipped as duplicates. */
  readonly duplicate: number;
  /** Messages left of the window, skipped without being called duplicates. */
  readonly stale: number;
  /** Messages without (or with malformed) identity headers. */
  readonly unidentified: number;
  /** Gaps reported when IDs were jumped over (they may still arrive). */
  readonly gapsReported: number;
  /** Gaps confirmed when IDs left the window unseen: possibly lost. */
  readonly gapsConfirmed: number;
  /** Skip declarations seen: IDs a producer declared it never used, not a loss. */
  readonly skips: number;
  /** LevelDB batches committed. */
  readonly commits: number;
}

function register(
  meter: Meter,
  observables: Record<string, Observable>,
  callback: BatchObservableCallback,
): () => void {
  const list = Object.values(observables);
  meter.addBatchObservableCallback(callback, list);
  return () => meter.removeBatchObservableCallback(callback, list);
}

/** A publisher's gauges, read at each collection. */
export interface PublisherGauges {
  readonly inFlight: number;
  readonly outbox: number;
  readonly parked: number;
}

/** Reports a publisher's counters and gauges; returns the function that stops reporting (on close). */
export function observePublisher(
  counters: Readonly<PublisherCounters>,
  producer: string,
  target: string,
  gauges?: () => PublisherGauges,
): () => void {
  const attributes = { producer, target };
  const { meter, publisher: i } = instruments();
  return register(meter, i, (result) => {
    if (gauges !== undefined) {
      const g = gauges();
      result.observe(i.inFlight, g.inFlight, attributes);
      result.observe(i.outbox, g.outbox, attributes);
      result.observe(i.parked, g.parked, attributes);
    }
    result.observe(i.sent, counters.sent, attributes);
    result.observe(i.confirmed, counters.confirmed, attributes);
    result.observe(i.resent, counters.resent, attributes);
    result.observe(i.keyDuplicates, counters.keyDuplicates, attributes);
    result.observe(i.reconnects, counters.reconnects, attributes);
  });
}

/**
 * The attributes every verifier instrument carries: the consumer's name and, when known, the stream
 * (queue, partition) it reads — a group member's partitions are one series each under the group's
 * name.
 */
export function verifierAttributes(consumer: string, stream: string | undefined): Attributes {
  return stream === undefined ? { consumer } : { consumer, stream };
}

/** Reports a verifying consumer's counters; returns the function that stops reporting. */
export function observeVerifier(
  counters: Readonly<VerifierCounters>,
  consumer: string,
  stream?: string,
): () => void {
  const { meter, verifier: i } = instruments();
  const base = verifierAttributes(consumer, stream);
  // `stream` last: Prometheus lines keep the order (`consumer="…",outcome="…",stream="…"`).
  const on = stream === undefined ? {} : { stream };
  return register(meter, i, (result) => {
    for (const outcome of ['new', 'duplicate', 'stale', 'unidentified'] as const) {
      result.observe(i.outcomes, counters[outcome], { consumer, outcome, ...on });
    }
    result.observe(i.gaps, counters.gapsReported, { consumer, confirmed: 'false', ...on });
    result.observe(i.gaps, counters.gapsConfirmed, { consumer, confirmed: 'true', ...on });
    result.observe(i.skips, counters.skips, base);
    result.observe(i.commits, counters.commits, base);
  });
}

/**
 * Reports `lag()` (the last lag read; `undefined`: none yet, nothing reported) as the lag gauge of
 * `consumer` on `stream`; returns the function that stops it.
 */
export function observeLag(consumer: string, stream: string, lag: () => bigint | undefined): () => void {
  const { meter, lag: gauge } = instruments();
  const attributes = { consumer, stream };
  return register(meter, { gauge }, (result) => {
    const value = lag();
    if (value !== undefined) result.observe(gauge, Number(value), attributes);
  });
}

/**
 * Reports a consumer group member's lag gauge: each `[partition, offsets]` of `lags()` (read at each
 * collection: the partitions the member holds) as the lag of `consumer` on the partition's stream;
 * returns the function that stops it.
 */
export function observeLags(consumer: string, lags: () => Iterable<readonly [string, bigint]>): () => void {
  const { meter, lag: gauge } = instruments();
  return register(meter, { gauge }, (result) => {
    for (const [stream, offsets] of lags()) result.observe(gauge, Number(offsets), { consumer, stream });
  });
}

/**
 * A histogram's recorder for fixed attributes (made once per publisher or consumer): `record(ms)`.
 * Without an SDK the API's no-op histogram costs a call.
 */
export function histogramRecorder(
  which: 'confirmLatency' | 'commitDuration' | 'restoreDuration',
  attributes: Attributes,
): (ms: number) => void {
  const h = instruments().histograms[which];
  return (ms) => h.record(ms, attributes);
}

/** One instrument the library emits: the docs' table and the dashboard's test read this list. @internal */
export interface InstrumentInfo {
  readonly name: string;
  readonly kind: 'counter' | 'gauge' | 'histogram';
  readonly unit: string;
  readonly attributes: readonly string[];
}

const P = ['producer', 'target'] as const;
/** A verifying consumer's: its name (a group's name for a member) and the stream (queue, partition) it reads. */
const V = ['consumer', 'stream'] as const;

/** Every instrument, as the SDK names it (a Prometheus exporter writes `.` as `_`). @internal */
export const INSTRUMENTS: readonly InstrumentInfo[] = [
  { name: 'stream_dedup.publisher.sent', kind: 'counter', unit: '{message}', attributes: P },
  { name: 'stream_dedup.publisher.confirmed', kind: 'counter', unit: '{message}', attributes: P },
  { name: 'stream_dedup.publisher.resent', kind: 'counter', unit: '{message}', attributes: P },
  { name: 'stream_dedup.publisher.key_duplicates', kind: 'counter', unit: '{message}', attributes: P },
  { name: 'stream_dedup.publisher.reconnects', kind: 'counter', unit: '{reconnect}', attributes: P },
  { name: 'stream_dedup.publisher.in_flight', kind: 'gauge', unit: '{message}', attributes: P },
  { name: 'stream_dedup.publisher.outbox', kind: 'gauge', unit: '{message}', attributes: P },
  { name: 'stream_dedup.publisher.parked', kind: 'gauge', unit: '{message}', attributes: P },
  { name: 'stream_dedup.publisher.confirm_latency', kind: 'histogram', unit: 'ms', attributes: P },
  {
    name: 'stream_dedup.verifier.outcomes',
    kind: 'counter',
    unit: '{message}',
    attributes: ['consumer', 'stream', 'outcome'],
  },
  {
    name: 'stream_dedup.verifier.gaps',
    kind: 'counter',
    unit: '{gap}',
    attributes: ['consumer', 'stream', 'confirmed'],
  },
  { name: 'stream_dedup.verifier.skips', kind: 'counter', unit: '{skip}', attributes: V },
  { name: 'stream_dedup.verifier.commits', kind: 'counter', unit: '{commit}', attributes: V },
  { name: 'stream_dedup.verifier.commit_duration', kind: 'histogram', unit: 'ms', attributes: V },
  { name: 'stream_dedup.verifier.lag', kind: 'gauge', unit: '{offset}', attributes: ['consumer', 'stream'] },
  {
    name: 'stream_dedup.group.restore_duration',
    kind: 'histogram',
    unit: 'ms',
    attributes: ['group', 'partition'],
  },
];
