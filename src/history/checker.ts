/**
 * A history checker in the manner of Jepsen's queue checkers. It compares what producers tried to
 * send, what they were told was sent, and what a reader found in the stream, and reports every
 * message that was lost, duplicated, unexpected or recovered, plus per-producer ordering faults.
 */

/** One message as read back from the stream. */
export interface ObservedMessage {
  /** The logical message's unique label (for example a body the test made unique). */
  readonly label: string;
  /** The producer name stamped in `x-dedup-producer`, when present. */
  readonly producerName?: string | undefined;
  /** The publishing ID stamped in `x-dedup-id`, when present. */
  readonly publishingId?: bigint | undefined;
}

/** The input of {@link checkHistory}. */
export interface History {
  /** Labels of every send that was attempted, resolved or not. */
  readonly attempted: Iterable<string>;
  /** Labels whose `send()` resolved: the library promised these are in the stream. */
  readonly acknowledged: Iterable<string>;
  /** The stream's messages in stream order. */
  readonly observed: readonly ObservedMessage[];
}

/** What {@link checkHistory} found. Every list is sorted and holds labels. */
export interface HistoryReport {
  /** Acknowledged, but not in the stream: the library broke its promise. */
  readonly lost: readonly string[];
  /** In the stream more than once (each label once, however many extra copies). */
  readonly duplicated: readonly string[];
  /** How many extra copies the stream holds in all (copies beyond the first). */
  readonly extraCopies: number;
  /** In the stream, but never attempted. */
  readonly unexpected: readonly string[];
  /** Attempted and not acknowledged (the sender crashed or gave up), yet in the stream once or more. */
  readonly recovered: readonly string[];
  /** Attempted, not acknowledged, not in the stream: allowed (the send never completed). */
  readonly unacknowledgedMissing: number;
  /** Per producer, the places where the stamped ID did not strictly increase in stream order. */
  readonly orderViolations: readonly OrderViolation[];
  /** True when nothing was lost, duplicated, unexpected or out of order. */
  readonly ok: boolean;
}

/** A place where a producer's stamped ID did not increase. */
export interface OrderViolation {
  /** The producer whose IDs went wrong. */
  readonly producerName: string;
  /** The producer's ID on the message before, in stream order. */
  readonly previousId: bigint;
  /** The ID on this message: not above `previousId`. */
  readonly publishingId: bigint;
  /** This message's label. */
  readonly label: string;
}

/**
 * Checks a history. Pure and synchronous.
 *
 * @example
 * ```ts
 * const report = checkHistory({ attempted, acknowledged, observed });
 * if (!report.ok) console.error(formatReport(report));
 * ```
 */
export function checkHistory(history: History): HistoryReport {
  const attempted = new Set(history.attempted);
  const acknowledged = new Set(history.acknowledged);
  const copies = new Map<string, number>();
  const orderViolations: OrderViolation[] = [];
  const lastId = new Map<string, bigint>();
  for (const m of history.observed) {
    copies.set(m.label, (copies.get(m.label) ?? 0) + 1);
    if (m.producerName !== undefined && m.publishingId !== undefined) {
      const previousId = lastId.get(m.producerName);
      if (previousId !== undefined && m.publishingId <= previousId) {
        orderViolations.push({
          producerName: m.producerName,
          previousId,
          publishingId: m.publishingId,
          label: m.label,
        });
      }
      if (previousId === undefined || m.publishingId > previousId) lastId.set(m.producerName, m.publishingId);
    }
  }
  const lost: string[] = [];
  for (const label of acknowledged) if (!copies.has(label)) lost.push(label);
  const duplicated: string[] = [];
  const unexpected: string[] = [];
  const recovered: string[] = [];
  let extraCopies = 0;
  for (const [label, n] of copies) {
    if (n > 1) {
      duplicated.push(label);
      extraCopies += n - 1;
    }
    if (!attempted.has(label) && !acknowledged.has(label)) unexpected.push(label);
    else if (!acknowledged.has(label)) recovered.push(label);
  }
  let unacknowledgedMissing = 0;
  for (const label of attempted) if (!acknowledged.has(label) && !copies.has(label)) unacknowledgedMissing++;
  return {
    lost: lost.sort(),
    duplicated: duplicated.sort(),
    extraCopies,
    unexpected: unexpected.sort(),
    recovered: recovered.sort(),
    unacknowledgedMissing,
    orderViolations,
    ok:
      lost.length === 0 && duplicated.length === 0 && unexpected.length === 0 && orderViolations.length === 0,
  };
}

/** A one-line summary with counts, for test output and the CLI. */
export function formatReport(report: HistoryReport): string {
  const sample = (xs: readonly string[]): string =>
    xs.length === 0 ? '' : ` [${xs.slice(0, 5).join(', ')}${xs.length > 5 ? ', …' : ''}]`;
  return (
    `lost=${report.lost.length}${sample(report.lost)} duplicated=${report.duplicated.length}${sample(report.duplicated)} ` +
    `(extra copies ${report.extraCopies}) unexpected=${report.unexpected.length}${sample(report.unexpected)} ` +
    `recovered=${report.recovered.length} unacknowledged-missing=${report.unacknowledgedMissing} ` +
    `order-violations=${report.orderViolations.length}`
  );
}
