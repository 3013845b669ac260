/**
 * Outbox relays as processes (test/fixtures/outbox-relay.ts), for the tests that SIGKILL, SIGSTOP
 * and fail over under them: start one, read its JSON lines, wait for one that matches, kill it.
 * Every process a test leaves running is SIGKILLed after the test (`useRelayProcesses`).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { afterEach } from 'vitest';
import type { RelayPlan } from '../fixtures/outbox-relay.js';

const fixture = fileURLToPath(new URL('../fixtures/outbox-relay.ts', import.meta.url));
const running = new Set<ChildProcess>();

/** SIGKILLs every relay process a test left running (stopped ones too), after each test of the file. */
export function useRelayProcesses(): void {
  afterEach(() => {
    for (const child of running) child.kill('SIGKILL');
    running.clear();
  });
}

/** A line the relay printed, and when the test read it (performance.now()). */
export type RelayLine = Record<string, unknown> & { at: number };

/** One relay process. */
export class RelayProcess {
  readonly child: ChildProcess;
  readonly lines: RelayLine[] = [];
  readonly exited: Promise<[number | null, NodeJS.Signals | null]>;
  readonly #waiters = new Set<{ test: (line: RelayLine) => boolean; resolve: (line: RelayLine) => void }>();
  #stderr = '';

  constructor(plan: RelayPlan) {
    const child = spawn(process.execPath, ['--import', 'tsx', fixture, JSON.stringify(plan)], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    this.child = child;
    running.add(child);
    child.once('exit', () => running.delete(child));
    this.exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    child.stderr.on('data', (chunk: Buffer) => {
      this.#stderr = (this.#stderr + chunk.toString()).slice(-4_000);
    });
    void (async () => {
      for await (const text of createInterface({ input: child.stdout })) {
        let parsed: Record<string, unknown>;
        try {
          parsed = JSON.parse(text) as Record<string, unknown>;
        } catch {
          parsed = { text };
        }
        const line = { ...parsed, at: performance.now() };
        this.lines.push(line);
        for (const w of this.#waiters) {
          if (w.test(line)) {
            this.#waiters.delete(w);
            w.resolve(line);
          }
        }
      }
    })();
  }

  /** The last 4 000 characters of its stderr. */
  get stderr(): string {
    return this.#stderr;
  }

  /**
   * Resolves with the first line (already read or to come) that passes `test`; rejects when the
   * process exits first or after `timeoutMs`, with what it printed.
   */
  waitFor(test: (line: RelayLine) => boolean, timeoutMs = 30_000, what = 'a line'): Promise<RelayLine> {
    const seen = this.lines.find(test);
    if (seen !== undefined) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const waiter = { test, resolve: (line: RelayLine): void => finish(() => resolve(line)) };
      const fail = (why: string): void =>
        finish(() =>
          reject(
            new Error(
              `relay: ${why} before ${what}; lines ${JSON.stringify(this.lines.slice(-8))}; stderr ${this.#stderr}`,
            ),
          ),
        );
      const timer = setTimeout(() => fail(`${timeoutMs} ms passed`), timeoutMs);
      const onExit = (code: number | null, signal: string | null): void =>
        // Lines printed just before the exit are read after it: give the reader a turn.
        void setImmediate(() => fail(`exited (${code ?? signal})`));
      const finish = (settle: () => void): void => {
        clearTimeout(timer);
        this.child.off('exit', onExit);
        this.#waiters.delete(waiter);
        settle();
      };
      this.#waiters.add(waiter);
      this.child.once('exit', onExit);
    });
  }

  /** Asks it to close (`relay.close()`); resolves with its exit. */
  async close(): Promise<[number | null, NodeJS.Signals | null]> {
    this.child.stdin!.write('close\n');
    return this.exited;
  }

  /** SIGKILLs it; resolves once it is gone. */
  async kill(): Promise<void> {
    this.child.kill('SIGKILL');
    await this.exited;
  }
}

/**
 * Rows of `producerName` not yet confirmed: waiting in the outbox table, or numbered into a batch
 * record (sent, or to be re-sent) whose confirm has not been handled.
 */
export async function rowsLeft(pool: pg.Pool, schema: string, producerName: string): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    `SELECT ((SELECT count(*) FROM "${schema}".outbox WHERE producer_name = $1) +
             (SELECT coalesce(sum(cardinality(row_ids)), 0) FROM "${schema}".outbox_batches
               WHERE producer_name = $1))::int AS n`,
    [producerName],
  );
  return rows[0]!.n;
}

/** Polls until no row of `producerName` is left (an event the test cannot otherwise hear). */
export async function waitForEmptyOutbox(
  pool: pg.Pool,
  schema: string,
  producerName: string,
  timeoutMs = 60_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const left = await rowsLeft(pool, schema, producerName);
    if (left === 0) return;
    if (Date.now() > deadline)
      throw new Error(`${left} outbox rows of ${producerName} left after ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
