// Captured at load: a model may install fake timers (for the cores' confirm-timeout and reconnect
// clocks); the liveness limits below must keep measuring wall time.
const realSetTimeout = globalThis.setTimeout;
const realClearTimeout = globalThis.clearTimeout;

/** Waits `ms` of wall time, even while fake timers are installed. */
export function realDelay(ms: number): Promise<void> {
  return new Promise((resolve) => realSetTimeout(resolve, ms));
}

/** One turn of the event loop (the publisher core pumps on `setImmediate`). */
export function turn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * Lets the event loop run until `progress()` stops changing for two turns in a row (memory-level
 * answers in microtasks, the cores schedule their work with `setImmediate`): the simulated world
 * is quiescent. Not a sleep: no timer is involved, and the bound only catches livelocks.
 */
export async function settle(progress: () => number, maxTurns = 200): Promise<void> {
  let last = progress();
  let quiet = 0;
  for (let i = 0; i < maxTurns; i++) {
    await turn();
    const now = progress();
    if (now === last) {
      if (++quiet >= 2) return;
    } else {
      quiet = 0;
      last = now;
    }
  }
  throw new Error(`the simulation did not settle within ${maxTurns} event-loop turns`);
}

/**
 * Awaits `promise`, failing loudly if it has not settled after `ms` of wall time. The timer only
 * detects a liveness bug (a core that never reconnects); it never orders anything.
 */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = realSetTimeout(() => reject(new Error(`${what}: nothing after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    realClearTimeout(timer);
  }
}
