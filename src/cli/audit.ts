/**
 * `stream-dedup audit`: what a stream's messages say about their producers. The analysis is pure
 * (records in, report out) so it is tested without a broker; `main.ts` reads the stream.
 */
import { createHash } from 'node:crypto';
import { AMQP091_TRANSPORT, readIdentity, TRANSPORT_HEADER } from '../identity/headers.js';
import type { IdRange } from '../verifier/types.js';
import type {
  AuditOptions,
  AuditRecord,
  AuditReport,
  ContradictionSample,
  DuplicateSample,
  OutOfOrderSample,
  ProducerAudit,
} from './audit-report.js';

// The report's types live in audit-report.ts, its text and JSON forms in audit-format.ts;
// importers of the engine find them here too.
export type {
  AuditOptions,
  AuditRecord,
  AuditReport,
  AuditSums,
  ContradictionSample,
  DuplicateSample,
  OutOfOrderSample,
  ProducerAudit,
  UnidentifiedAudit,
} from './audit-report.js';
export {
  formatAuditDetails,
  formatAuditJson,
  formatAuditReport,
  formatAuditVerdict,
} from './audit-format.js';

interface ProducerAcc {
  messages: number;
  /** Every ID's index in {@link FirstCopies}, in stream order of first appearance. */
  readonly firstOffsets: Map<bigint, number>;
  maxId: bigint;
  minId: bigint;
  /** The ID of the producer's first message in the records. */
  readonly rangeFloor: bigint;
  firstOffset: bigint;
  lastOffset: bigint;
  duplicates: number;
  readonly duplicateSamples: DuplicateSample[];
  expectedCopies: number;
  readonly expectedCopySamples: DuplicateSample[];
  conflictingCopies: number;
  readonly conflictingCopySamples: DuplicateSample[];
  outOfOrder: number;
  readonly outOfOrderSamples: OutOfOrderSample[];
  /** Declared skips in stream order, with the offset of the declaring message. */
  readonly declared: Array<{ readonly range: IdRange; readonly at: bigint }>;
  /** The highest `to` of the declared ranges: IDs above it need no check. */
  declaredTop: bigint;
  contradictions: number;
  readonly contradictionSamples: ContradictionSample[];
}

/**
 * Audits a stream's messages, in stream order: per producer name (from the `x-dedup-producer`
 * and `x-dedup-id` stamps, read as `readIdentity(applicationProperties, messageAnnotations)`)
 * the duplicates, the gaps between the lowest and the highest ID, and the messages out of order.
 * Pure and synchronous. The engine of `stream-dedup audit`, whose command line is the public
 * interface.
 *
 * @internal
 */
export function auditRecords(records: Iterable<AuditRecord>, options: AuditOptions = {}): AuditReport {
  const maxSamples = options.maxSamples ?? 10;
  if (!Number.isInteger(maxSamples) || maxSamples < 0) {
    throw new RangeError(`maxSamples must be an integer ≥ 0, got ${maxSamples}`);
  }
  const producers = new Map<string, ProducerAcc>();
  const firstCopies = new FirstCopies();
  const partial = options.partial === true;
  let beforeRange = 0;
  let messages = 0;
  let missing = 0;
  let malformed = 0;
  const unidentifiedSamples: Array<{ offset: bigint; reason: string }> = [];
  for (const record of records) {
    messages++;
    const reading = readIdentity(record.applicationProperties, record.messageAnnotations);
    if (reading.kind !== 'ok') {
      if (reading.kind === 'missing') missing++;
      else malformed++;
      if (unidentifiedSamples.length < maxSamples) {
        unidentifiedSamples.push({
          offset: record.offset,
          reason: reading.kind === 'missing' ? 'no identity headers' : reading.reason,
        });
      }
      continue;
    }
    const { producerName, publishingId: id } = reading.identity;
    let p = producers.get(producerName);
    if (p === undefined) {
      p = {
        messages: 0,
        firstOffsets: new Map(),
        maxId: id,
        minId: id,
        rangeFloor: id,
        firstOffset: record.offset,
        lastOffset: record.offset,
        duplicates: 0,
        duplicateSamples: [],
        expectedCopies: 0,
        expectedCopySamples: [],
        conflictingCopies: 0,
        conflictingCopySamples: [],
        outOfOrder: 0,
        outOfOrderSamples: [],
        declared: [],
        declaredTop: 0n,
        contradictions: 0,
        contradictionSamples: [],
      };
      producers.set(producerName, p);
    }
    p.messages++;
    p.lastOffset = record.offset;
    // Only an AMQP 0-9-1 message can be a re-send of one before the range: the broker deduplicates
    // the stream protocol by name, so an unmarked one is judged (out of order), as in a whole audit.
    if (partial && id < p.rangeFloor && !p.firstOffsets.has(id) && isAmqp091(record)) {
      beforeRange++;
      continue;
    }
    if (id <= p.declaredTop) {
      for (const d of p.declared) {
        if (id >= d.range.from && id <= d.range.to) {
          p.contradictions++;
          if (p.contradictionSamples.length < maxSamples) {
            p.contradictionSamples.push({
              publishingId: id,
              offset: record.offset,
              declared: d.range,
              declaredAt: d.at,
            });
          }
          break;
        }
      }
    }
    const skippedFrom = reading.identity.skippedFrom;
    if (skippedFrom !== undefined) {
      p.declared.push({ range: { from: skippedFrom, to: id - 1n }, at: record.offset });
      if (id - 1n > p.declaredTop) p.declaredTop = id - 1n;
    }
    const first = p.firstOffsets.get(id);
    if (first !== undefined) {
      const firstOffset = firstCopies.offset(first);
      // The copy's own mark decides: an AMQP 0-9-1 re-send of the same message is expected, a
      // marked copy of another message conflicts, any unmarked copy is a duplicate.
      if (isAmqp091(record)) {
        if (messageDigest(record) === firstCopies.digest(first)) {
          p.expectedCopies++;
          if (p.expectedCopySamples.length < maxSamples) {
            p.expectedCopySamples.push({ publishingId: id, offset: record.offset, firstOffset });
          }
        } else {
          p.conflictingCopies++;
          if (p.conflictingCopySamples.length < maxSamples) {
            p.conflictingCopySamples.push({ publishingId: id, offset: record.offset, firstOffset });
          }
        }
      } else {
        p.duplicates++;
        if (p.duplicateSamples.length < maxSamples) {
          p.duplicateSamples.push({ publishingId: id, offset: record.offset, firstOffset });
        }
      }
      continue;
    }
    p.firstOffsets.set(id, firstCopies.add(record.offset, messageDigest(record)));
    if (id < p.maxId) {
      p.outOfOrder++;
      if (p.outOfOrderSamples.length < maxSamples) {
        p.outOfOrderSamples.push({ publishingId: id, offset: record.offset, previousMaxId: p.maxId });
      }
    }
    if (id > p.maxId) p.maxId = id;
    if (id < p.minId) p.minId = id;
  }

  const audits: ProducerAudit[] = [];
  for (const [producerName, p] of producers) {
    // First appearances are in ID order unless something arrived out of order.
    const ids = [...p.firstOffsets.keys()];
    if (p.outOfOrder > 0) ids.sort(compareBigInt);
    let missingIds = 0n;
    let gaps = 0;
    const gapRanges: IdRange[] = [];
    let skippedIds = 0n;
    const skippedRanges: IdRange[] = [];
    const declared = mergeRanges(p.declared.map((d) => d.range));
    for (let i = 1; i < ids.length; i++) {
      const previous = ids[i - 1]!;
      const id = ids[i]!;
      if (id <= previous + 1n) continue;
      // A hole: the parts that a skip declares are skipped, the rest is a gap.
      for (const part of splitByRanges({ from: previous + 1n, to: id - 1n }, declared)) {
        const size = part.range.to - part.range.from + 1n;
        if (part.declared) {
          skippedIds += size;
          if (skippedRanges.length < maxSamples) skippedRanges.push(part.range);
        } else {
          missingIds += size;
          gaps++;
          if (gapRanges.length < maxSamples) gapRanges.push(part.range);
        }
      }
    }
    audits.push({
      producerName,
      messages: p.messages,
      distinctIds: ids.length,
      firstId: p.minId,
      lastId: p.maxId,
      firstOffset: p.firstOffset,
      lastOffset: p.lastOffset,
      duplicates: p.duplicates,
      duplicateSamples: p.duplicateSamples,
      expectedCopies: p.expectedCopies,
      expectedCopySamples: p.expectedCopySamples,
      conflictingCopies: p.conflictingCopies,
      conflictingCopySamples: p.conflictingCopySamples,
      missingIds,
      gaps,
      gapRanges,
      skippedIds,
      skippedRanges,
      contradictions: p.contradictions,
      contradictionSamples: p.contradictionSamples,
      outOfOrder: p.outOfOrder,
      outOfOrderSamples: p.outOfOrderSamples,
    });
  }
  audits.sort((a, b) => (a.producerName < b.producerName ? -1 : a.producerName > b.producerName ? 1 : 0));
  const duplicates = sum(audits.map((a) => a.duplicates));
  const expectedCopies = sum(audits.map((a) => a.expectedCopies));
  const conflictingCopies = sum(audits.map((a) => a.conflictingCopies));
  const gaps = sum(audits.map((a) => a.gaps));
  const outOfOrder = sum(audits.map((a) => a.outOfOrder));
  const missingIds = audits.reduce((s, a) => s + a.missingIds, 0n);
  const skippedIds = audits.reduce((s, a) => s + a.skippedIds, 0n);
  const contradictions = sum(audits.map((a) => a.contradictions));
  return {
    messages,
    beforeRange,
    producers: audits,
    unidentified: { count: missing + malformed, missing, malformed, samples: unidentifiedSamples },
    duplicates,
    expectedCopies,
    conflictingCopies,
    missingIds,
    gaps,
    skippedIds,
    outOfOrder,
    contradictions,
    ok: duplicates === 0 && conflictingCopies === 0 && gaps === 0 && outOfOrder === 0 && contradictions === 0,
  };
}

/**
 * Whether a message carries the AMQP 0-9-1 publisher's mark. Over the stream protocol RabbitMQ 4
 * hands AMQP 0-9-1 `x-` headers over as message annotations; an AMQP 0-9-1 reader sees headers.
 */
function isAmqp091(record: AuditRecord): boolean {
  return (
    record.messageAnnotations?.[TRANSPORT_HEADER] === AMQP091_TRANSPORT ||
    record.applicationProperties?.[TRANSPORT_HEADER] === AMQP091_TRANSPORT
  );
}

/**
 * The offset and message digest of each (producer, ID)'s first copy, in two growing typed arrays:
 * 16 bytes an ID besides the map entry that holds its index (a small integer, no allocation).
 */
class FirstCopies {
  #offsets = new BigUint64Array(1024);
  #digests = new BigUint64Array(1024);
  #length = 0;

  /** Stores a first copy; returns its index. */
  add(offset: bigint, digest: bigint): number {
    if (this.#length === this.#offsets.length) {
      const offsets = new BigUint64Array(this.#length * 2);
      offsets.set(this.#offsets);
      this.#offsets = offsets;
      const digests = new BigUint64Array(this.#length * 2);
      digests.set(this.#digests);
      this.#digests = digests;
    }
    this.#offsets[this.#length] = offset;
    this.#digests[this.#length] = digest;
    return this.#length++;
  }

  offset(index: number): bigint {
    return this.#offsets[index]!;
  }

  digest(index: number): bigint {
    return this.#digests[index]!;
  }
}

/**
 * Headers that say how the message travelled, not what it is: the `x-dedup-` stamps, and what
 * RabbitMQ 4 adds as message annotations to an AMQP 0-9-1 publish (`x-exchange`,
 * `x-routing-key`, the basic properties without an AMQP 1.0 field as `x-basic-*`).
 */
function isTransportHeader(name: string): boolean {
  return (
    name.startsWith('x-dedup-') ||
    name === 'x-exchange' ||
    name === 'x-routing-key' ||
    name.startsWith('x-basic-')
  );
}

/**
 * 64 bits of SHA-256 over the body and the caller's headers, from both sections in name order
 * (an AMQP 0-9-1 publisher's `x-` headers arrive as annotations, the rest and a stream
 * publisher's as application properties), so an AMQP 0-9-1 re-send matches its first copy
 * whichever transport wrote that. Two different messages collide with probability 2^-64.
 */
function messageDigest(record: AuditRecord): bigint {
  const headers: Array<readonly [string, unknown]> = [];
  for (const section of [record.applicationProperties, record.messageAnnotations]) {
    if (section === undefined) continue;
    for (const name of Object.keys(section)) {
      if (!isTransportHeader(name)) headers.push([name, section[name]]);
    }
  }
  headers.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const hash = createHash('sha256');
  hash.update(canonical(headers));
  hash.update('\0');
  if (record.body !== undefined) hash.update(record.body);
  return hash.digest().readBigUInt64BE(0);
}

/**
 * A header value as text that is equal for equal values, whichever decoder produced it: an
 * integer as a `number` or a `bigint` alike (a stream publisher's number comes back from the
 * broker as an AMQP long). Depth is bounded by the decoder (32).
 */
function canonical(value: unknown): string {
  if (typeof value === 'string') return `s${JSON.stringify(value)}`;
  if (typeof value === 'bigint') return `i${value}`;
  if (typeof value === 'number') return Number.isInteger(value) ? `i${BigInt(value)}` : `f${value}`;
  if (typeof value === 'boolean') return `b${value}`;
  if (value === null || value === undefined) return 'z';
  if (value instanceof Uint8Array)
    return `x${Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString('hex')}`;
  if (value instanceof Date) return `t${value.getTime()}`;
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value instanceof Map) {
    const entries = [...value.entries()].map(([k, v]) => `${canonical(k)}:${canonical(v)}`);
    return `m{${entries.sort().join(',')}}`;
  }
  if (typeof value === 'object') {
    const entries = Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((value as Record<string, unknown>)[k])}`);
    return `{${entries.join(',')}}`;
  }
  return `o${typeof value}`; // a symbol or a function: no decoder produces one
}

/** Sorted, overlapping or touching ranges joined. */
function mergeRanges(ranges: readonly IdRange[]): IdRange[] {
  const sorted = [...ranges].sort((a, b) => compareBigInt(a.from, b.from));
  const out: IdRange[] = [];
  for (const r of sorted) {
    const last = out[out.length - 1];
    if (last !== undefined && r.from <= last.to + 1n) {
      if (r.to > last.to) out[out.length - 1] = { from: last.from, to: r.to };
    } else {
      out.push(r);
    }
  }
  return out;
}

/** `hole` cut into the parts inside and outside the (merged, sorted) declared ranges, in order. */
function splitByRanges(
  hole: IdRange,
  declared: readonly IdRange[],
): Array<{ readonly range: IdRange; readonly declared: boolean }> {
  const parts: Array<{ range: IdRange; declared: boolean }> = [];
  let from = hole.from;
  for (const d of declared) {
    if (d.to < from) continue;
    if (d.from > hole.to) break;
    if (d.from > from) parts.push({ range: { from, to: d.from - 1n }, declared: false });
    const to = d.to < hole.to ? d.to : hole.to;
    parts.push({ range: { from: d.from > from ? d.from : from, to }, declared: true });
    from = to + 1n;
    if (from > hole.to) return parts;
  }
  if (from <= hole.to) parts.push({ range: { from, to: hole.to }, declared: false });
  return parts;
}

/**
 * The CLI's exit code for a report: 0 when clean (declared skips included), 1 for duplicates,
 * gaps, messages out of order or a contradicted skip.
 */
export function auditExitCode(report: AuditReport): 0 | 1 {
  return report.ok ? 0 : 1;
}

function compareBigInt(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function sum(xs: readonly number[]): number {
  return xs.reduce((s, x) => s + x, 0);
}
