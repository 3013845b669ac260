import { openSync, writeSync } from 'node:fs';
import { DedupError } from '../errors.js';
import { AmqpDedupPublisher } from '../transport/amqp-publisher.js';
import { SuperStreamDedupPublisher } from '../superstream/publisher.js';
import { StreamDedupPublisher } from '../transport/stream-publisher.js';
import type { Durability } from '../publisher/types.js';
import { silentLogger } from '../telemetry/logger.js';
import type { AmqpDedupPublisherOptions } from '../transport/amqp-options.js';
import type { StreamDedupPublisherOptions, SubEntryOptions } from '../transport/stream-options.js';
import type { SuperStreamDedupPublisherOptions } from '../superstream/options.js';
import { amqpSocketOptionsFromEnv, amqpUrlFromEnv, connectionFromEnv } from './env.js';

/** Options of the producer process that the demo and the crash tests kill and restart. */
export interface ProduceOptions {
  /** The stream (or stream queue) to publish to; not used with `superStream`. */
  readonly stream: string;
  /**
   * Publish to this super stream instead (stream transport only): hash routing, the routing key
   * being the message's label, carried in its {@link ROUTE_HEADER} header (in keyed mode the key,
   * which is the label, routes). Acknowledgements are logged as `k <label> <partition> <id>`.
   */
  readonly superStream?: string | undefined;
  readonly producerName: string;
  readonly store: string;
  /** Labels are `<run>-<i>`: unique across runs, so every body names one logical message. */
  readonly run: number;
  readonly count: number;
  /**
   * Append-only log: `a <label>` before a send, `k <label>` once it resolved (on a super stream
   * `k <label> <partition> <publishingId>`).
   */
  readonly log: string;
  readonly durability: Durability;
  readonly concurrency: number;
  /** `stream`: the stream protocol (broker dedup); `amqp`: AMQP 0-9-1 into the stream queue (no broker dedup). */
  readonly transport: 'stream' | 'amqp';
  /**
   * Keyed sends: every run sends keys `k-1` … `k-<count>` again from the start, as an application
   * that re-creates its messages after a crash would; the key index publishes each once.
   */
  readonly keyed: boolean;
  /** Sub-entry batching (stream transport only). */
  readonly subEntry?: SubEntryOptions | undefined;
  /**
   * The publisher's `confirmTimeoutMs`. A send that times out is logged `t <label>` and the run
   * goes on, as an application would: the message stays with the publisher, which replaces its
   * connection and re-sends it (its fate shows in the stream, not in the log).
   */
  readonly confirmTimeoutMs?: number | undefined;
  /** The publisher's `connectTimeoutMs` (how long one connection attempt may take). */
  readonly connectTimeoutMs?: number | undefined;
}

/** The header that carries a super stream message's routing key (its label) in `produce`. */
export const ROUTE_HEADER = 'route-key';

/** The part of a publisher `produce` uses, single stream or super stream. */
interface Producer {
  /** Resolves once confirmed; the partition and ID are logged with the acknowledgement. */
  send(label: string): Promise<{ partition?: string; publishingId: bigint }>;
  close(): Promise<void>;
  /** What open() found and did (summed over the partitions of a super stream, and per partition). */
  readonly openReport: Record<string, unknown>;
  /** The last publishing ID (per partition on a super stream), for the closing line. */
  last(): Record<string, unknown>;
}

/**
 * Publishes `count` uniquely labelled messages, logging each attempt before the send and each
 * acknowledgement after it (synchronous appends: they survive a SIGKILL). Prints JSON lines on
 * stdout, so a parent knows when killing it is interesting: `{"opening":true}` before `open()`,
 * `{"ready":…}` once open, then `{"acked":n}` every hundredth of `count`.
 */
export async function produce(o: ProduceOptions): Promise<void> {
  const fd = openSync(o.log, 'a');
  const common = {
    producerName: o.producerName,
    store: o.store,
    durability: o.durability,
    idMode: o.keyed ? ('keyed' as const) : ('auto' as const),
    ...(o.confirmTimeoutMs === undefined ? {} : { confirmTimeoutMs: o.confirmTimeoutMs }),
    ...(o.connectTimeoutMs === undefined ? {} : { connectTimeoutMs: o.connectTimeoutMs }),
    // The publisher's errors as progress lines (`{"error": …}`), for the parent to check.
    logger: {
      ...silentLogger,
      error: (obj: object, msg?: string) => {
        const { err, ...detail } = obj as { err?: unknown };
        const cause = err instanceof Error ? { cause: err.message } : {};
        process.stdout.write(`${JSON.stringify({ error: msg ?? '', ...jsonable(detail), ...cause })}\n`);
      },
    },
  };
  const open = async (): Promise<Producer> => {
    if (o.superStream !== undefined) {
      if (o.transport !== 'stream')
        throw new TypeError('a super stream is published over the stream transport');
      // The flags reach open() as given: --keyed with --durability reserve is refused there
      // (DEDUP_UNSAFE_OPTIONS), which the types would refuse for a literal.
      const pub = await SuperStreamDedupPublisher.open({
        ...common,
        connection: connectionFromEnv(),
        superStream: o.superStream,
        ...(o.subEntry === undefined ? {} : { subEntry: o.subEntry }),
        // Keyed: the domain key (the label) routes by the same hash.
        ...(o.keyed
          ? {}
          : { routing: { kind: 'hash', key: (_body, headers) => headers?.[ROUTE_HEADER] as string } }),
      } as SuperStreamDedupPublisherOptions);
      const reports = [...pub.openReports.values()];
      return {
        send: (label) =>
          pub.send(Buffer.from(label), {
            headers: { [ROUTE_HEADER]: label },
            ...(o.keyed ? { key: label } : {}),
          }),
        close: () => pub.close(),
        openReport: {
          resent: reports.reduce((n, r) => n + r.resent, 0),
          partitions: Object.fromEntries([...pub.openReports].map(([p, r]) => [p, jsonable(r)])),
        },
        last: () => ({ lastPublishingIds: jsonable(Object.fromEntries(pub.lastPublishingIds)) }),
      };
    }
    // As above: --keyed with --durability reserve reaches open() and is refused there.
    const pub =
      o.transport === 'amqp'
        ? await AmqpDedupPublisher.open({
            ...common,
            url: amqpUrlFromEnv(),
            socketOptions: amqpSocketOptionsFromEnv(),
            queue: o.stream,
            declareQueue: true,
          } as AmqpDedupPublisherOptions)
        : await StreamDedupPublisher.open({
            ...common,
            connection: connectionFromEnv(),
            stream: o.stream,
            createStream: true,
            ...(o.subEntry === undefined ? {} : { subEntry: o.subEntry }),
          } as StreamDedupPublisherOptions);
    return {
      send: (label) => pub.send(Buffer.from(label), o.keyed ? { key: label } : {}),
      close: () => pub.close(),
      openReport: jsonable(pub.openReport),
      last: () => ({ lastPublishingId: pub.lastPublishingId.toString() }),
    };
  };
  // A parent that wants to kill while open() reconciles starts its clock here.
  process.stdout.write(`${JSON.stringify({ opening: true })}\n`);
  // As an application would: while a cluster elects a new leader, open() is refused for a while.
  const deadline = performance.now() + 60_000;
  let pub: Producer;
  for (;;) {
    try {
      pub = await open();
      break;
    } catch (err) {
      const transient =
        err instanceof DedupError &&
        (err.code === 'DEDUP_BROKER_UNREACHABLE' || err.code === 'DEDUP_BROKER_REFUSED');
      if (!transient || performance.now() > deadline) throw err;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }
  process.stdout.write(`${JSON.stringify({ ready: true, ...pub.openReport })}\n`);
  let next = 1;
  let acked = 0;
  let timeouts = 0;
  // About a hundred progress lines per run: a parent can kill on observed progress, not on a timer.
  const every = Math.max(1, Math.floor(o.count / 100));
  const worker = async (): Promise<void> => {
    while (next <= o.count) {
      const label = o.keyed ? `k-${next++}` : `${o.run}-${next++}`;
      writeSync(fd, `a ${label}\n`);
      let sent: Awaited<ReturnType<Producer['send']>>;
      try {
        sent = await pub.send(label);
      } catch (err) {
        if (!(err instanceof DedupError && err.code === 'DEDUP_CONFIRM_TIMEOUT')) throw err;
        writeSync(fd, `t ${label}\n`);
        timeouts++;
        continue;
      }
      writeSync(
        fd,
        sent.partition === undefined ? `k ${label}\n` : `k ${label} ${sent.partition} ${sent.publishingId}\n`,
      );
      if (++acked % every === 0) process.stdout.write(`${JSON.stringify({ acked })}\n`);
    }
  };
  await Promise.all(Array.from({ length: o.concurrency }, worker));
  await pub.close();
  process.stdout.write(`${JSON.stringify({ done: true, timeouts, ...pub.last() })}\n`);
}

function jsonable(o: object): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, typeof v === 'bigint' ? v.toString() : v]));
}
