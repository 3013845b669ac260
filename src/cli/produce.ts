import { openSync, writeSync } from 'node:fs';
import { DedupError } from '../errors.js';
import { AmqpDedupPublisher } from '../transport/amqp.js';
import { StreamDedupPublisher } from '../transport/stream.js';
import type { Durability } from '../publisher/types.js';
import { amqpSocketOptionsFromEnv, amqpUrlFromEnv, connectionFromEnv } from './env.js';

/** Options of the producer process that the demo and the crash tests kill and restart. */
export interface ProduceOptions {
  readonly stream: string;
  readonly producerName: string;
  readonly store: string;
  /** Labels are `<run>-<i>`: unique across runs, so every body names one logical message. */
  readonly run: number;
  readonly count: number;
  /** Append-only log: `a <label>` before a send, `k <label>` once it resolved. */
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
}

/**
 * Publishes `count` uniquely labelled messages, logging each attempt before the send and each
 * acknowledgement after it (synchronous appends: they survive a SIGKILL). Prints one JSON line
 * `{"ready":…}` on stdout once open, so a parent knows when killing it is interesting, then
 * `{"acked":n}` every hundredth of `count`.
 */
export async function produce(o: ProduceOptions): Promise<void> {
  const fd = openSync(o.log, 'a');
  const common = {
    producerName: o.producerName,
    store: o.store,
    durability: o.durability,
    idMode: o.keyed ? ('keyed' as const) : ('auto' as const),
  };
  const open = (): Promise<AmqpDedupPublisher | StreamDedupPublisher> =>
    o.transport === 'amqp'
      ? AmqpDedupPublisher.open({
          ...common,
          url: amqpUrlFromEnv(),
          socketOptions: amqpSocketOptionsFromEnv(),
          queue: o.stream,
          declareQueue: true,
        })
      : StreamDedupPublisher.open({
          ...common,
          connection: connectionFromEnv(),
          stream: o.stream,
          createStream: true,
        });
  // As an application would: while a cluster elects a new leader, open() is refused for a while.
  const deadline = performance.now() + 60_000;
  let pub: AmqpDedupPublisher | StreamDedupPublisher;
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
  process.stdout.write(`${JSON.stringify({ ready: true, ...jsonable(pub.openReport) })}\n`);
  let next = 1;
  let acked = 0;
  // About a hundred progress lines per run: a parent can kill on observed progress, not on a timer.
  const every = Math.max(1, Math.floor(o.count / 100));
  const worker = async (): Promise<void> => {
    while (next <= o.count) {
      const label = o.keyed ? `k-${next++}` : `${o.run}-${next++}`;
      writeSync(fd, `a ${label}\n`);
      await pub.send(Buffer.from(label), o.keyed ? { key: label } : {});
      writeSync(fd, `k ${label}\n`);
      if (++acked % every === 0) process.stdout.write(`${JSON.stringify({ acked })}\n`);
    }
  };
  await Promise.all(Array.from({ length: o.concurrency }, worker));
  await pub.close();
  process.stdout.write(
    `${JSON.stringify({ done: true, lastPublishingId: pub.lastPublishingId.toString() })}\n`,
  );
}

function jsonable(o: object): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, typeof v === 'bigint' ? v.toString() : v]));
}
