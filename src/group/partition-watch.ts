/**
 * The stalled-partition watch of one partition of a member (docs/design.md §12). RabbitMQ can
 * leave a partition's single-active-consumer group with members and none of them active, for good
 * (seen with 4.0 when a node dies); only an emptied group starts again. While the member is
 * subscribed but not active, the watch compares the partition's last chunk with what the group
 * last wrote of it (the changelog's last entry); input that waits `stalledMs` with nothing written,
 * and a message there to prove it, makes the member leave the group for a while and join again.
 * Every member of a stuck group does the same, so the group empties.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import type { Generation } from '../consumer/resubscribe.js';
import type { Logger } from '../telemetry/logger.js';
import { errorText, withTimeout } from '../transport/util.js';
import { firstMessage } from './changelog-head.js';
import { StallWatch } from './stall-watch.js';
import type { GroupStats } from './types.js';

/** How long the stalled-partition watch waits for one query's answer, or for a message it looks for. */
const WATCH_QUERY_MS = 5_000;
const WATCH_PROBE_MS = 2_000;

/**
 * How often the stalled-partition watch reads the broker (a sixth of `stalledMs`, 1 to 10 s), and
 * how long a member stays out of a stalled group the first time. A member in a stuck group leaves
 * it at most `checkMs + stalledMs + checkMs` (its first reading, the wait, the reading that sees
 * the wait over) plus the probe (well under 5 s) after it joined: staying out longer than that,
 * a member is out when the other member of a pair leaves, whatever their phases, and the group is
 * empty then. More members, or slower probes, are met by doubling (StallWatch.leaving).
 *
 * @internal
 */
export function watchTimings(stalledMs: number): { checkMs: number; leaveMs: number } {
  const checkMs = Math.min(10_000, Math.max(1_000, Math.round(stalledMs / 6)));
  return { checkMs, leaveMs: stalledMs + 3 * checkMs + 5_000 };
}

/** The subscription in place (its consumer declared). */
export interface Subscribed {
  readonly generation: Generation<Client>;
  readonly client: Client;
}

/** What the watch needs of the member's partition. @internal */
export interface PartitionWatchOptions {
  readonly partition: string;
  readonly consumerName: string;
  /** `stalledPartitionMs`; 0 turns the watch off. */
  readonly stalledMs: number;
  readonly log: Logger;
  readonly stats: GroupStats;
  /** What the group last wrote of the partition (the changelog's last ID). */
  readonly lastWritten: (client: Client, timeoutMs: number) => Promise<bigint>;
  readonly connectReader: () => Promise<Client>;
  /** The subscription in place, if any. */
  readonly subscribed: () => Subscribed | undefined;
  /** Subscribed through `generation` (still current), not active, no activation under way, open. */
  readonly mayWatch: (generation: Generation<Client> | undefined) => boolean;
  /** Leaves the partition's group for `ms` and joins again. */
  readonly leave: (generation: Generation<Client>, ms: number) => void;
}

/** @internal */
export class PartitionWatch {
  readonly #o: PartitionWatchOptions;
  readonly #watch: StallWatch;
  #timer: NodeJS.Timeout | undefined;
  /** The reading under way, which close() waits for. */
  #watching: Promise<void> | undefined;
  /** The probe connection while open, which close() closes at once. */
  #reader: Client | undefined;
  #closed = false;

  constructor(options: PartitionWatchOptions) {
    this.#o = options;
    this.#watch = new StallWatch(options.stalledMs);
  }

  /** Starts the watch, unless it is off or running. */
  start(): void {
    if (this.#o.stalledMs === 0 || this.#timer !== undefined || this.#closed) return;
    this.#timer = setInterval(() => void this.#check(), watchTimings(this.#o.stalledMs).checkMs);
    this.#timer.unref();
  }

  /** Stops the watch: its probe connection closes at once, a reading under way is waited for (bounded). */
  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    const reader = this.#reader;
    if (reader !== undefined) void withTimeout(reader.close(), 5_000, 'closing').catch(() => undefined);
    await withTimeout(this.#watching ?? Promise.resolve(), WATCH_QUERY_MS, 'closing').catch(() => undefined);
  }

  /** One reading. Never throws: a reading that fails is skipped. */
  async #check(): Promise<void> {
    if (this.#watching !== undefined || this.#closed) return;
    const subscribed = this.#o.subscribed();
    if (!this.#o.mayWatch(subscribed?.generation)) {
      this.#watch.reset();
      return;
    }
    const run = this.#read(subscribed!).catch((err: unknown) => {
      try {
        this.#o.log.debug(
          { consumer: this.#o.consumerName, partition: this.#o.partition, err: errorText(err) },
          'stream-dedup: stalled-partition watch could not read the broker',
        );
      } catch {
        // A logger that throws changes nothing.
      }
    });
    this.#watching = run;
    await run;
    this.#watching = undefined;
  }

  async #read({ client, generation }: Subscribed): Promise<void> {
    const { partition } = this.#o;
    const lastId = await this.#o.lastWritten(client, WATCH_QUERY_MS);
    const stats = await withTimeout(client.streamStatsRequest(partition), WATCH_QUERY_MS, 'reading stats');
    if (!this.#o.mayWatch(generation)) return;
    const from = this.#watch.observe({
      lastId,
      committedChunkId: stats.committedChunkId,
      at: performance.now(),
    });
    if (from === undefined) return;
    // The proof, on a connection of its own (close() closes it at once).
    const reader = await this.#o.connectReader();
    this.#reader = reader;
    let found;
    try {
      if (this.#closed) return;
      ({ message: found } = await firstMessage(reader, partition, from, WATCH_PROBE_MS));
    } finally {
      this.#reader = undefined;
      await withTimeout(reader.close(), 5_000, 'closing').catch(() => undefined);
    }
    if (found === undefined) {
      this.#watch.foundNothing(performance.now());
      return;
    }
    // Checked again after the last await, and nothing awaited from here to the leave: an
    // activation cannot begin in between.
    if (!this.#o.mayWatch(generation)) return;
    const leaveMs = watchTimings(this.#o.stalledMs).leaveMs * this.#watch.leaving();
    this.#o.stats.rejoins++;
    this.#o.log.warn(
      {
        consumer: this.#o.consumerName,
        partition,
        waitingFrom: from.toString(),
        stalledMs: this.#o.stalledMs,
        leaveMs,
      },
      'stream-dedup: partition has input no member applies (a RabbitMQ single-active-consumer group ' +
        'left without an active consumer); leaving the group for a while and joining again',
    );
    this.#o.leave(generation, leaveMs);
  }
}
