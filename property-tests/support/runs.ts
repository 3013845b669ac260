import fc from 'fast-check';
import { expect } from 'vitest';

/** Runs per model: 1 000 unless FC_NUM_RUNS says otherwise (property-tests/setup.ts). */
export const MODEL_RUNS = fc.readConfigureGlobal().numRuns ?? 1_000;

/** True when FC_PATH replays one counterexample: then only that run happens. */
export const IS_REPLAY = process.env.FC_PATH !== undefined;

/** Throws fast-check's report, with the property's own error (which `fc.assert` would hide in a cause). */
function throwReport<Ts>(what: string, details: fc.RunDetails<Ts>): void {
  if (!details.failed) return;
  const cause = details.errorInstance;
  throw new Error(
    `${fc.defaultReportMessage(details) ?? `${what} failed`}\nError: ${
      cause instanceof Error ? (cause.stack ?? cause.message) : String(cause)
    }`,
  );
}

/** `fc.assert` for async properties, with the property's error in the message. */
export async function assertProperty<Ts>(
  what: string,
  property: fc.IAsyncProperty<Ts>,
  params: fc.Parameters<Ts> = {},
): Promise<void> {
  throwReport(what, await fc.check<Ts>(property, params));
}

/**
 * Checks an async property within a wall-time budget and fails unless it passed AND at least
 * `runs` runs completed: the time limit keeps CI bounded, and a machine too slow to reach the
 * required runs fails loudly instead of passing on fewer. Prints the figures.
 */
export async function checkWithin<Ts>(
  what: string,
  property: fc.IAsyncProperty<Ts>,
  options: { readonly runs?: number; readonly timeLimitMs: number },
): Promise<fc.RunDetails<Ts>> {
  const runs = options.runs ?? MODEL_RUNS;
  const started = performance.now();
  const details = await fc.check<Ts>(property, {
    numRuns: runs,
    plugins: [fc.interruptAfterTimeLimit(options.timeLimitMs, { failOnInterrupt: false })],
  });
  const ms = Math.round(performance.now() - started);
  console.log(
    `[${what}] ${details.numRuns} runs completed in ${ms} ms` +
      (details.interrupted ? ` (interrupted by the ${options.timeLimitMs} ms budget)` : ''),
  );
  throwReport(what, details);
  if (!IS_REPLAY) {
    expect(details.numRuns, `${what}: runs completed within the budget`).toBeGreaterThanOrEqual(runs);
  }
  return details;
}

/**
 * Checks a property that must NOT hold (the plain highest-sequence policy of docs/design.md §6): fast-check
 * must find a counterexample and shrink it. Prints the shrunk counterexample and returns it.
 */
export async function expectCounterexample<Ts>(
  what: string,
  property: fc.IAsyncProperty<Ts> | fc.IProperty<Ts>,
  runs = 1_000,
): Promise<Ts> {
  const details = await fc.check<Ts>(property as fc.IAsyncProperty<Ts>, { numRuns: runs });
  expect(details.failed, `${what}: fast-check found no counterexample in ${details.numRuns} runs`).toBe(true);
  const counterexample = details.counterexample!;
  console.log(
    `[${what}] counterexample after ${details.numRuns} runs and ${details.numShrinks} shrinks ` +
      `(seed ${details.seed}, path ${details.counterexamplePath ?? '?'}): ${fc.stringify(counterexample)}`,
  );
  return counterexample;
}
