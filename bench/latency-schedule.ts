/**
 * What bench:latency's send→confirm cases (bench/latency.ts) and its end-to-end cases
 * (bench/latency-e2e.ts) share: the open-loop schedule and the histogram's bounds.
 */
import * as hdr from 'hdr-histogram-js';
import type { Histogram } from 'hdr-histogram-js';

/** The body size of every message, in bytes. */
export const SIZE = 100;

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
): Promise<void> {
  const t0 = performance.now() + 5;
  const period = 1000 / rate;
  let issued = 0;
  while (issued < count) {
    const slice = performance.now();
    const due = Math.min(count, Math.floor((slice - t0) / period) + 1);
    while (issued < due) {
      const r = issue(issued, t0 + issued * period);
      if (r !== undefined) await r;
      issued++;
      if ((issued & 255) === 0 && performance.now() - slice > 1) break;
    }
    if (issued < due) await new Promise((resolve) => setImmediate(resolve));
    else if (issued < count) await new Promise((resolve) => setTimeout(resolve, 1));
  }
}
