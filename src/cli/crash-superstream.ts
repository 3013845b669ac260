/**
 * The crash scenario on a super stream (issue 18): producer processes publishing through a
 * `SuperStreamDedupPublisher` are SIGKILLed and restarted on one store, then every partition is
 * read back and checked — per partition (IDs are per partition) and over the whole super stream.
 */
import { readFile } from 'node:fs/promises';
import { checkHistory, type HistoryReport, type OrderViolation } from '../history/checker.js';
import { readIdentity } from '../identity/headers.js';
import { Locator } from '../superstream/partitions.js';
import { readStreamToEnd } from '../transport/stream-ops.js';
import { auditRecords, type AuditReport } from './audit.js';
import { runKillLoop, withCrashDir, type CrashRunOptions } from './crash.js';
import { connectionFromEnv } from './env.js';

/** Options of {@link runSuperStreamCrashScenario}. */
export interface SuperStreamCrashScenarioOptions extends CrashRunOptions {
  /** An existing super stream; the producer routes by hash, the routing key being each message's label. */
  readonly superStream: string;
  /**
   * The partition a reference routing sends a routing key to (for example the JavaScript client's
   * own super stream publisher): every message must be there, and be acknowledged as there.
   */
  readonly expectedPartition: (routingKey: string) => string | Promise<string>;
}

/** What {@link runSuperStreamCrashScenario} found in one partition. */
export interface PartitionCrashReport {
  readonly partition: string;
  /**
   * The history of this partition alone: the attempts and acknowledgements the reference routing
   * sends here, against what the partition holds; its order violations are this partition's IDs.
   */
  readonly report: HistoryReport;
  readonly messages: number;
  /** Acknowledged labels that the reference routing sends here. */
  readonly acknowledged: number;
  /** The highest publishing ID in the partition (undefined when it is empty). */
  readonly lastId: bigint | undefined;
  /** What `stream-dedup audit` says of the partition: declared skips apart from gaps. */
  readonly audit: AuditReport;
}

/** What {@link runSuperStreamCrashScenario} measured. */
export interface SuperStreamCrashResult {
  /**
   * Over the whole super stream: lost (acknowledged, in no partition), duplicated (twice in one
   * partition or in two), unexpected, recovered; order violations are every partition's own.
   */
  readonly report: HistoryReport;
  readonly partitions: readonly PartitionCrashReport[];
  /** Messages not where the reference routing puts them, or acknowledged with another partition. */
  readonly misrouted: readonly string[];
  /** Acknowledgements whose partition or publishing ID is not the one the message has in the stream. */
  readonly idMismatches: readonly string[];
  /** True when the report is ok and nothing is misrouted or mismatched. */
  readonly ok: boolean;
  readonly runs: number;
  readonly kills: number;
  /** Kills that landed before `open()` returned (once it had begun: `kill.afterOpeningMs`). */
  readonly killsDuringOpen: number;
  readonly attempted: number;
  readonly acknowledged: number;
  readonly streamMessages: number;
  /** Outbox messages re-sent with their original IDs, summed over every restart and partition. */
  readonly resent: number;
  readonly acknowledgedLabels: readonly string[];
}

/** One acknowledgement line of a super stream producer: `k <label> <partition> <publishingId>`. */
interface Ack {
  readonly label: string;
  readonly partition: string;
  readonly publishingId: bigint;
}

/** One message read back from a partition. */
interface Observed {
  readonly label: string;
  readonly producerName: string | undefined;
  readonly publishingId: bigint | undefined;
}

/**
 * Runs a super stream producer process, SIGKILLs it at random moments `kills` times, restarts it
 * each time on the same store, lets the last run finish, then reads every partition and checks:
 * every acknowledged message exactly once in the whole super stream, in the partition the
 * reference routing picks and acknowledged as there with the ID it has in the stream, and each
 * partition's IDs increasing in stream order.
 */
export async function runSuperStreamCrashScenario(
  o: SuperStreamCrashScenarioOptions,
): Promise<SuperStreamCrashResult> {
  const locator = new Locator(connectionFromEnv(), 10_000);
  let partitions: string[];
  try {
    partitions = await locator.partitions(o.superStream);
  } finally {
    await locator.close();
  }
  return withCrashDir(async ({ store, log }) => {
    const { runs, kills, killsDuringOpen, resent } = await runKillLoop(o, ['--super-stream', o.superStream], {
      store,
      log,
    });
    await o.beforeRead?.();
    const read = new Map<string, Observed[]>();
    const audits = new Map<string, AuditReport>();
    for (const partition of partitions) {
      const records = await readStreamToEnd(connectionFromEnv(), partition);
      audits.set(partition, auditRecords(records));
      read.set(
        partition,
        records.map((r) => {
          const identity = readIdentity(r.applicationProperties, r.messageAnnotations);
          return {
            label: r.body.toString('utf8'),
            producerName: identity.kind === 'ok' ? identity.identity.producerName : undefined,
            publishingId: identity.kind === 'ok' ? identity.identity.publishingId : undefined,
          };
        }),
      );
    }
    const { attempted, acks } = parseLog(await readFile(log, 'utf8'));
    const acknowledged = acks.map((a) => a.label);

    // The reference routing of every label attempted or found.
    const expected = new Map<string, string>();
    const labels = new Set([...attempted, ...[...read.values()].flat().map((m) => m.label)]);
    for (const label of labels) expected.set(label, await o.expectedPartition(label));

    const misrouted: string[] = [];
    const found = new Map<string, { partition: string; publishingId: bigint | undefined }>();
    const perPartition: PartitionCrashReport[] = [];
    for (const [partition, observed] of read) {
      for (const m of observed) {
        if (expected.get(m.label) !== partition)
          misrouted.push(`${m.label} is in ${partition}, routed to ${expected.get(m.label)}`);
        if (!found.has(m.label)) found.set(m.label, { partition, publishingId: m.publishingId });
      }
      const here = (label: string): boolean => expected.get(label) === partition;
      const ids = observed.flatMap((m) => (m.publishingId === undefined ? [] : [m.publishingId]));
      perPartition.push({
        partition,
        report: checkHistory({
          attempted: attempted.filter(here),
          acknowledged: acknowledged.filter(here),
          observed,
        }),
        messages: observed.length,
        acknowledged: new Set(acknowledged.filter(here)).size,
        lastId: ids.reduce<bigint | undefined>(
          (max, id) => (max === undefined || id > max ? id : max),
          undefined,
        ),
        audit: audits.get(partition)!,
      });
    }
    const idMismatches: string[] = [];
    for (const ack of acks) {
      if (ack.partition !== expected.get(ack.label))
        misrouted.push(`${ack.label} acknowledged in ${ack.partition}, routed to ${expected.get(ack.label)}`);
      const at = found.get(ack.label);
      if (at !== undefined && (at.partition !== ack.partition || at.publishingId !== ack.publishingId)) {
        idMismatches.push(
          `${ack.label} acknowledged as ${ack.partition} #${ack.publishingId}, ` +
            `in the stream as ${at.partition} #${at.publishingId ?? '(no ID)'}`,
        );
      }
    }

    // Across partitions: a label in two partitions is a duplicate too. IDs are per partition, so
    // the order check is each partition's own.
    const whole = checkHistory({
      attempted,
      acknowledged,
      observed: [...read.values()].flat().map((m) => ({ label: m.label })),
    });
    const orderViolations: OrderViolation[] = perPartition.flatMap((p) => p.report.orderViolations);
    const report: HistoryReport = {
      ...whole,
      orderViolations,
      ok: whole.ok && orderViolations.length === 0,
    };
    const streamMessages = perPartition.reduce((n, p) => n + p.messages, 0);
    return {
      report,
      partitions: perPartition,
      misrouted,
      idMismatches,
      ok: report.ok && misrouted.length === 0 && idMismatches.length === 0,
      runs,
      kills,
      killsDuringOpen,
      attempted: attempted.length,
      acknowledged: acknowledged.length,
      streamMessages,
      resent,
      acknowledgedLabels: acknowledged,
    };
  });
}

/** The attempts (`a <label>`) and acknowledgements (`k <label> <partition> <id>`) of a history log. */
function parseLog(text: string): { attempted: string[]; acks: Ack[] } {
  const attempted: string[] = [];
  const acks: Ack[] = [];
  for (const line of text.split('\n')) {
    if (line.startsWith('a ')) attempted.push(line.slice(2));
    else if (line.startsWith('k ')) {
      const [label, partition, id] = line.slice(2).split(' ');
      if (label === undefined || partition === undefined || id === undefined)
        throw new Error(`history log: an acknowledgement without partition and ID: "${line}"`);
      acks.push({ label, partition, publishingId: BigInt(id) });
    }
  }
  return { attempted, acks };
}
