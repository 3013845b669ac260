import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { checkHistory, type HistoryReport } from '../history/checker.js';
import { readIdentity } from '../identity/headers.js';
import { auditRecords, type AuditReport } from './audit.js';
import type { Durability } from '../publisher/types.js';
import { readStreamToEnd } from '../transport/stream-ops.js';
import { connectionFromEnv } from './env.js';

/** What every crash scenario takes: the producer processes and how they are killed. */
export interface CrashRunOptions {
  /** The command that starts this CLI (for example `[process.execPath, 'dist/cli/main.js']`). */
  readonly cli: readonly string[];
  readonly producerName: string;
  /** How many runs are SIGKILLed mid-way; one last run then finishes. */
  readonly kills: number;
  /** Messages each run tries to send. */
  readonly perRun: number;
  /**
   * When to kill a run: `{ afterMs: [min, max] }`, a random delay once the producer is open (kills
   * may land anywhere, or not at all when the run finishes first); or `{ afterAcked: [min, max] }`,
   * a random fraction of `perRun` acknowledged (a kill that always lands mid-way); or
   * `{ afterOpeningMs: [min, max] }`, a random delay once the producer starts `open()` (kills that
   * land while it reconciles with the broker and queues its outbox, or soon after). A list: the
   * runs take its moments in turn (for example a kill while publishing, which leaves an outbox,
   * then one while the next `open()` re-sends it).
   * @defaultValue `{ afterMs: [50, 600] }`
   */
  readonly kill?: KillMoment | readonly KillMoment[];
  readonly durability?: Durability;
  /** Keyed sends, resuming from the first key after every kill. @defaultValue false */
  readonly keyed?: boolean;
  /** The producer publishes in sub-entry batches (stream transport). */
  readonly subEntry?: { readonly size: number; readonly compression?: 'none' | 'gzip' | 'zstd' };
  /** Sends each producer keeps in flight. @defaultValue 64 */
  readonly concurrency?: number;
  /** The producers' `confirmTimeoutMs` (a timed-out send is logged and the run goes on). */
  readonly confirmTimeoutMs?: number;
  /** The producers' `connectTimeoutMs`. */
  readonly connectTimeoutMs?: number;
  /**
   * Runs go on (each killed at its moment, or finishing) until `kills` landed and this settled;
   * then the last run. For faults of a known length: the producer keeps publishing through all
   * of them. Without it, runs stop once `kills` landed.
   */
  readonly runUntil?: Promise<unknown>;
  /** Awaited after the last run, before the stream is read back (for example: faults settling). */
  readonly beforeRead?: () => Promise<unknown>;
  /** Called with a line of progress. */
  readonly onProgress?: (line: string) => void;
}

/** When to kill a run: see {@link CrashRunOptions.kill}. */
export type KillMoment =
  | { readonly afterMs: readonly [number, number] }
  | { readonly afterAcked: readonly [number, number] }
  | { readonly afterOpeningMs: readonly [number, number] };

/** Options of {@link runCrashScenario}. */
export interface CrashScenarioOptions extends CrashRunOptions {
  readonly stream: string;
  /** The producer's transport. @defaultValue 'stream' */
  readonly transport?: 'stream' | 'amqp';
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
  /** What the producers' publishers logged as errors, over every run. */
  readonly producerErrors: readonly string[];
  /** What `stream-dedup audit` says of the stream: declared skips apart from gaps. */
  readonly audit: AuditReport;
}

/**
 * Runs a producer process, SIGKILLs it at random moments `kills` times, restarts it each time on
 * the same store, lets the last run finish, then reads the stream back and checks the history:
 * every acknowledged message exactly once, nothing twice, IDs increasing.
 */
export async function runCrashScenario(o: CrashScenarioOptions): Promise<CrashScenarioResult> {
  return withCrashDir(async ({ store, log }) => {
    const { runs, kills, resent, errors } = await runKillLoop(
      o,
      ['--stream', o.stream, '--transport', o.transport ?? 'stream'],
      { store, log },
    );
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
      producerErrors: errors,
    };
  });
}

/**
 * Runs `fn` with a fresh temporary folder's store and history log paths, then removes the folder.
 * @internal
 */
export async function withCrashDir<T>(fn: (paths: { store: string; log: string }) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'stream-dedup-crash-'));
  try {
    return await fn({ store: join(dir, 'store'), log: join(dir, 'history.log') });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Runs producer processes on one store and log until `kills` of them were really SIGKILLed
 * mid-way (a run may finish before its kill time), then one last run that finishes. `target` are
 * the `_produce` arguments naming where to publish.
 * @internal
 */
export async function runKillLoop(
  o: CrashRunOptions,
  target: readonly string[],
  files: { readonly store: string; readonly log: string },
): Promise<{ runs: number; kills: number; killsDuringOpen: number; resent: number; errors: string[] }> {
  const listed: readonly KillMoment[] = [o.kill ?? []].flat();
  const moments: readonly KillMoment[] = listed.length > 0 ? listed : [{ afterMs: [50, 600] }];
  const between = ([min, max]: readonly [number, number]): number => min + Math.random() * (max - min);
  let resent = 0;
  let kills = 0;
  let killsDuringOpen = 0;
  const errors: string[] = [];
  const progress = (
    run: number,
    outcome: { killed: boolean; resent: number; duringOpen: boolean },
    kill?: KillAt,
  ): void => {
    const when =
      kill === undefined
        ? ''
        : 'afterMs' in kill
          ? ` ${Math.round(kill.afterMs)} ms after open`
          : 'afterOpeningMs' in kill
            ? ` ${Math.round(kill.afterOpeningMs)} ms after open() began`
            : ` at ${kill.afterAcked} acked`;
    o.onProgress?.(
      `run ${run}: ${outcome.killed ? `killed (SIGKILL${when}${outcome.duringOpen ? ', before open() returned' : ''})` : 'finished'}` +
        `${outcome.resent > 0 ? `, re-sent ${outcome.resent} outbox messages on open` : ''}`,
    );
  };
  let run = 0;
  let over = o.runUntil === undefined;
  // Runs (and kills) counted from the moment `runUntil` settled.
  let runsBefore = 0;
  let killsBefore = 0;
  const end = (): void => {
    over = true;
    runsBefore = run;
    killsBefore = kills;
  };
  o.runUntil?.then(end, end);
  while (kills < o.kills || !over) {
    run++;
    if (over && run - runsBefore > (o.kills - killsBefore) * 5 + 5)
      throw new Error(`only ${kills} of ${o.kills} kills landed in ${run - 1} runs`);
    const kill = moments[(run - 1) % moments.length]!;
    const at: KillAt =
      'afterMs' in kill
        ? { afterMs: between(kill.afterMs) }
        : 'afterOpeningMs' in kill
          ? { afterOpeningMs: between(kill.afterOpeningMs) }
          : { afterAcked: Math.max(1, Math.floor(between(kill.afterAcked) * o.perRun)) };
    const outcome = await runOnce(o, target, { run, ...files, kill: at });
    resent += outcome.resent;
    errors.push(...outcome.errors);
    if (outcome.killed) kills++;
    if (outcome.duringOpen) killsDuringOpen++;
    progress(run, outcome, at);
  }
  run++;
  const last = await runOnce(o, target, { run, ...files, kill: undefined });
  resent += last.resent;
  errors.push(...last.errors);
  progress(run, last);
  return { runs: run, kills, killsDuringOpen, resent, errors };
}

/** One run's kill moment. */
type KillAt = { afterMs: number } | { afterAcked: number } | { afterOpeningMs: number };

async function runOnce(
  o: CrashRunOptions,
  target: readonly string[],
  r: {
    run: number;
    store: string;
    log: string;
    kill: KillAt | undefined;
  },
): Promise<{ killed: boolean; resent: number; duringOpen: boolean; errors: string[] }> {
  const [cmd, ...args] = o.cli;
  const child = spawn(
    cmd!,
    [
      ...args,
      '_produce',
      ...target,
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
      ...(o.keyed === true ? ['--keyed'] : []),
      ...(o.subEntry === undefined
        ? []
        : ['--sub-entry', String(o.subEntry.size), '--compression', o.subEntry.compression ?? 'none']),
      ...(o.confirmTimeoutMs === undefined ? [] : ['--confirm-timeout-ms', String(o.confirmTimeoutMs)]),
      ...(o.connectTimeoutMs === undefined ? [] : ['--connect-timeout-ms', String(o.connectTimeoutMs)]),
      ...(o.concurrency === undefined ? [] : ['--concurrency', String(o.concurrency)]),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let resent = 0;
  let killSent = false;
  const exited = new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
    child.once('exit', (code, signal) => resolve([code, signal])),
  );
  let opened = false;
  let duringOpen = false;
  // Once its output has ended the run is over: a kill timer firing before its exit event must
  // not land (nor hide the exit code of a run that failed); and a kill counts only when the exit
  // says SIGKILL ended it.
  let ended = false;
  let killTimer: NodeJS.Timeout | undefined;
  const errors: string[] = [];
  const killNow = (): void => {
    if (!killSent && !ended && child.exitCode === null) {
      killSent = child.kill('SIGKILL');
      duringOpen = killSent && !opened;
    }
  };
  for await (const line of createInterface({ input: child.stdout })) {
    let msg: { opening?: boolean; ready?: boolean; resent?: number; acked?: number; error?: string };
    try {
      msg = JSON.parse(line) as typeof msg;
    } catch {
      continue; // not one of the producer's progress lines (a warning of Node's, say)
    }
    if (msg.error !== undefined) errors.push(msg.error);
    if (msg.opening === true && r.kill !== undefined && 'afterOpeningMs' in r.kill)
      killTimer = setTimeout(killNow, r.kill.afterOpeningMs);
    if (msg.ready === true) {
      opened = true;
      resent = msg.resent ?? 0;
      if (r.kill !== undefined && 'afterMs' in r.kill) killTimer = setTimeout(killNow, r.kill.afterMs);
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
  ended = true;
  clearTimeout(killTimer);
  const [code, signal] = await exited;
  const killed = signal === 'SIGKILL';
  if (!killed && code !== 0) throw new Error(`producer run ${r.run} exited with code ${code}`);
  return { killed, resent, duringOpen: killed && duringOpen, errors };
}
