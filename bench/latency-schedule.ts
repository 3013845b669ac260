/**
 * What bench:latency's send→confirm cases (bench/latency.ts) and its end-to-end cases
 * (bench/latency-e2e.ts) share: the open-loop schedule and the histogram's bounds.
 */
import * as hdr from 'hdr-histogram-js';
import type { Histogram } from 'hdr-histogram-js';
import { connect, type Client, type ClientListenersParams } from 'rabbitmq-stream-js-client';
import { guardHeartbeats } from '../src/transport/stream-client-internals.js';
import { CONNECTION } from './common.js';

/** The body size of every message, in bytes. */
export const SIZE = 100;

/**
 * A raw client for the baselines, with Nagle's algorithm off on every connection it opens, as the
 * library has on its own (`guardHeartbeats`; rabbitmq-stream-js-client 1.0 leaves it on). With it
 * on, the raw consumer's one-chunk credit requests and the raw publisher's small publish frames
 * wait for the broker's delayed ACK: measured at 14 192 msg/s (publisher and consumer in two
 * processes, load 4–5), the raw consumer ran 100–1 500 ms behind its publisher and never caught
 * up, while the publisher's own confirms came in 2–9 ms; with Nagle off on both, 2–6 ms.
 */
export async function connectRawClient(listeners?: ClientListenersParams): Promise<Client> {
  const client = await connect({
    ...CONNECTION,
    addressResolver: { enabled: false },
    ...(listeners === undefined ? {} : { listeners }),
  });
  guardHeartbeats(client);
  return client;
}

/** A histogram of latencies in µs: 1 µs to 120 s, 3 significant digits. */
export const newHistogram = (): Histogram =>
  hdr.build({
    lowestDiscernibleValue: 1,
    highestTrackableValue: 120_000_000,
    numberOfSignificantValueDigits: 3,
  });

/**
 * The open-loop generator: calls `issue(i, due)` for every message whose due time (ms, on
 * performance.now()) has come, waking every millisecond, until `count` are issued. `issue` may be
 * async (the raw client's buffered send): the generator awaits it, so a send that blocks delays the
 * next issue — and that delay is charged to the messages' latency, measured from `due`.
 *
 * Behind its schedule, it issues for at most about 1 ms before it lets I/O run (setImmediate): a
 * synchronous `issue` (a dedup send, not awaited) would otherwise issue the whole backlog in one
 * turn of the event loop, no confirm heard meanwhile — at 75 % of a fast day's maximum (249 032
 * msg/s) the outbox case ran so for over 25 minutes instead of 12 s.
 */
export async function runSchedule(
  rate: number,
  count: number,
  issue: (i: number, due: number) => void | Promise<void>,
): Promise<ScheduleLag> {
  const t0 = performance.now() + 5;
  const period = 1000 / rate;
  let issued = 0;
  let maxLagMs = 0;
  let lateSlices = 0;
  while (issued < count) {
    const slice = performance.now();
    const due = Math.min(count, Math.floor((slice - t0) / period) + 1);
    if (issued < due) {
      // How late the oldest message due in this slice is issued: the generator's own delay.
      const lag = slice - (t0 + issued * period);
      if (lag > maxLagMs) maxLagMs = lag;
      if (lag > LATE_MS) lateSlices++;
    }
    while (issued < due) {
      const r = issue(issued, t0 + issued * period);
      if (r !== undefined) await r;
      issued++;
      if ((issued & 255) === 0 && performance.now() - slice > 1) break;
    }
    if (issued < due) await new Promise((resolve) => setImmediate(resolve));
    else if (issued < count) await new Promise((resolve) => setTimeout(resolve, 1));
  }
  return { maxLagMs, lateSlices };
}

/** A slice of the schedule whose first message is issued more than this late counts as late. */
const LATE_MS = 10;

/**
 * How late the generator itself issued (its event loop busy or its process not scheduled): latency
 * that no broker or consumer caused. `lateSlices`: the wake-ups whose oldest due message was over
 * 10 ms late.
 */
export interface ScheduleLag {
  readonly maxLagMs: number;
  readonly lateSlices: number;
}
