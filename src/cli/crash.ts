import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { checkHistory, type HistoryReport } from '../history/checker.js';
import { readIdentity } from '../identity/headers.js';
import { auditRecords, type AuditReport } from './audit.js';
import type { Durability } from '../publisher/types.js';
import { readStreamToEnd } from '../transport/stream.js';
import { connectionFromEnv } from './env.js';

/** Options of {@link runCrashScenario}. */
export interface CrashScenarioOptions {
  /** The command that starts this CLI (for example `[process.execPath, 'dist/cli/main.js']`). */
  readonly cli: readonly string[];
  readonly stream: string;
  readonly producerName: string;
  /** How many runs are SIGKILLed mid-way; one last run then finishes. */
  readonly kills: number;
  /** Messages each run tries to send. */
  readonly perRun: number;
  /**
   * When to kill a run: `{ afterMs: [min, max] }`, a random delay once the producer is open (kills
   * may land anywhere, or not at all when the run finishes first); or `{ afterAcked: [min, max] }`,
   * a random fraction of `perRun` acknowledged (a kill that always lands mid-way).
   * @defaultValue `{ afterMs: [50, 600] }`
   */
  readonly kill?:
    { readonly afterMs: readonly [number, number] } | { readonly afterAcked: readonly [number, number] };
  readonly durability?: Durability;
  /** The producer's transport. @defaultValue 'stream' */
  readonly transport?: 'stream' | 'amqp';
  /** Keyed sends, resuming from the first key after every kill. @defaultValue false */
  readonly keyed?: boolean;
  /** Awaited after the last run, before the stream is read back (for example: faults settling). */
  readonly beforeRead?: () => Promise<unknown>;
  /** Called with a line of progress. */
  readonly onProgress?: (line: string) => void;
}

/** What {@link runCrashScenario} measured. */
export interface CrashScenarioResult {
  readonly report: HistoryReport;
  readonly runs: number;
  readonly kills: number;
  readonly attempted: number;
  readonly acknowledged: number;
  readonly streamMessages: number;
  /** Outbox messages re-sent with their original IDs, summed over every restart. */
  readonly resent: number;
  /** The labels acknowledged by the producer (for a consumer-side check). */
  readonly acknowledgedLabels: readonly string[];
  /** What `stream-dedup audit` says of the stream: declared skips apart from gaps. */
  readonly audit: AuditReport;
}

/**
 * Runs a producer process, SIGKILLs it at random moments `kills` times, restarts it each time on
 * the same store, lets the last run finish, then reads the stream back and checks the history:
 * every acknowledged message exactly once, nothing twice, IDs increasing.
 */
export async function runCrashScenario(o: CrashScenarioOptions): Promise<CrashScenarioResult> {
  const dir = await mkdtemp(join(tmpdir(), 'stream-dedup-crash-'));
  const log = join(dir, 'history.log');
  const store = join(dir, 'store');
  const kill = o.kill ?? { afterMs: [50, 600] as const };
  const between = ([min, max]: readonly [number, number]): number => min + Math.random() * (max - min);
  let resent = 0;
  let kills = 0;
  let runs = 0;
  const progress = (run: number, outcome: { killed: boolean; resent: number }): void => {
    runs = run;
    o.onProgress?.(
      `run ${run}: ${outcome.killed ? 'killed (SIGKILL)' : 'finished'}` +
        `${outcome.resent > 0 ? `, re-sent ${outcome.resent} outbox messages on open` : ''}`,
    );
  };
  try {
    // Runs until `kills` runs were really killed mid-way (a run may finish before its kill time),
    // then one last run that finishes.
    let run = 0;
    while (kills < o.kills) {
      run++;
      if (run > o.kills * 5 + 5)
        throw new Error(`only ${kills} of ${o.kills} kills landed in ${run - 1} runs`);
      const outcome = await runOnce(o, {
        run,
        store,
        log,
        kill:
          'afterMs' in kill
            ? { afterMs: between(kill.afterMs) }
            : { afterAcked: Math.max(1, Math.floor(between(kill.afterAcked) * o.perRun)) },
      });
      resent += outcome.resent;
      if (outcome.killed) kills++;
      progress(run, outcome);
    }
    run++;
    const last = await runOnce(o, { run, store, log, kill: undefined });
    resent += last.resent;
    progress(run, last);
    await o.beforeRead?.();
    const records = await readStreamToEnd(connectionFromEnv(), o.stream);
    const text = await readFile(log, 'utf8');
    const attempted: string[] = [];
    const acknowledged: string[] = [];
    for (const line of text.split('\n')) {
      if (line.startsWith('a ')) attempted.push(line.slice(2));
      else if (line.startsWith('k ')) acknowledged.push(line.slice(2));
    }
    const observed = records.map((r) => {
      const identity = readIdentity(r.applicationProperties, r.messageAnnotations);
      return {
        label: r.body.toString('utf8'),
        producerName: identity.kind === 'ok' ? identity.identity.producerName : undefined,
        publishingId: identity.kind === 'ok' ? identity.identity.publishingId : undefined,
      };
    });
    const report = checkHistory({ attempted, acknowledged, observed });
    return {
      audit: auditRecords(records),
      report,
      runs,
      kills,
      attempted: attempted.length,
      acknowledged: acknowledged.length,
      streamMessages: records.length,
      resent,
      acknowledgedLabels: acknowledged,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function runOnce(
  o: CrashScenarioOptions,
  r: {
    run: number;
    store: string;
    log: string;
    kill: { afterMs: number } | { afterAcked: number } | undefined;
  },
): Promise<{ killed: boolean; resent: number }> {
  const [cmd, ...args] = o.cli;
  const child = spawn(
    cmd!,
    [
      ...args,
      '_produce',
      '--stream',
      o.stream,
      '--producer',
      o.producerName,
      '--store',
      r.store,
      '--run',
      String(r.run),
      '--count',
      String(o.perRun),
      '--log',
      r.log,
      '--durability',
      o.durability ?? 'outbox',
      '--transport',
      o.transport ?? 'stream',
      ...(o.keyed === true ? ['--keyed'] : []),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let resent = 0;
  let killed = false;
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const killNow = (): void => {
    if (!killed) killed = child.kill('SIGKILL');
  };
  for await (const line of createInterface({ input: child.stdout })) {
    let msg: { ready?: boolean; resent?: number; acked?: number };
    try {
      msg = JSON.parse(line) as typeof msg;
    } catch {
      continue; // not one of the producer's progress lines (a warning of Node's, say)
    }
    if (msg.ready === true) {
      resent = msg.resent ?? 0;
      if (r.kill !== undefined && 'afterMs' in r.kill) setTimeout(killNow, r.kill.afterMs);
    }
    if (
      msg.acked !== undefined &&
      r.kill !== undefined &&
      'afterAcked' in r.kill &&
      msg.acked >= r.kill.afterAcked
    ) {
      killNow();
    }
  }
  const code = await exited;
  if (!killed && code !== 0) throw new Error(`producer run ${r.run} exited with code ${code}`);
  return { killed, resent };
}
