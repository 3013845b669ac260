/**
 * Exponential backoff, the one used by every reconnect and retry loop: each delay doubles up to a
 * maximum; with jitter a wait is a random half to all of the delay (so that clients cut off
 * together do not come back together).
 */
export class Backoff {
  readonly #initialDelayMs: number;
  readonly #maxDelayMs: number;
  readonly #jitter: boolean;
  #delay: number;

  constructor(options: {
    readonly initialDelayMs: number;
    readonly maxDelayMs: number;
    readonly jitter?: boolean;
  }) {
    this.#initialDelayMs = options.initialDelayMs;
    this.#maxDelayMs = options.maxDelayMs;
    this.#jitter = options.jitter ?? true;
    this.#delay = options.initialDelayMs;
  }

  /** The next wait in ms; the delay after it doubles (up to the maximum). */
  next(): number {
    const delay = this.#delay;
    this.#delay = Math.min(delay * 2, this.#maxDelayMs);
    return this.#jitter ? delay * (0.5 + Math.random() / 2) : delay;
  }

  /** Starts over from the initial delay. */
  reset(): void {
    this.#delay = this.#initialDelayMs;
  }
}

/**
 * Waits `ms`; `wake` (if given) receives a function that ends the wait early. Resolves either way.
 */
export function sleep(ms: number, wake?: (stop: () => void) => void): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    wake?.(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}
