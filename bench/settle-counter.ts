/**
 * Waits for a known number of promises without holding them (bench:latency, issue 39 profile).
 *
 * `Promise.all` over a run's sends (1.3 M at 130 k msg/s for 10 s) subscribes to each one
 * synchronously when it is called, right after the last send: 0.5–0.9 s of blocked event loop on
 * this machine (854 ms for 1.3 M promises), during which the confirms of the run's last messages
 * wait. It was the max (600–660 ms) of the dedup cases, not the publisher's. The array also keeps
 * every settled promise alive for the whole run (heap and GC).
 */
export interface SettleCounter {
  /** Counts `p` when it settles; the first rejection rejects {@link SettleCounter.all}. */
  add(p: Promise<unknown>): void;
  /** Resolves once `count` promises given to `add` resolved. */
  readonly all: Promise<void>;
}

export function settleCounter(count: number): SettleCounter {
  let settled = 0;
  let resolveAll = (): void => undefined;
  let rejectAll = (_err: unknown): void => undefined;
  const all = new Promise<void>((resolve, reject) => {
    resolveAll = resolve;
    rejectAll = reject;
  });
  if (count <= 0) resolveAll();
  const done = (): void => {
    if (++settled === count) resolveAll();
  };
  return {
    add: (p) => {
      p.then(done, rejectAll);
    },
    all,
  };
}
