import { parseArgs } from 'node:util';
import { formatReport } from '../history/checker.js';
import { deleteStream } from '../transport/stream-ops.js';
import { runCrashScenario } from './crash.js';
import { connectionFromEnv } from './env.js';

/**
 * `stream-dedup demo`: a producer publishes into a fresh stream, is SIGKILLed mid-run `--kills`
 * times and restarted on the same store, then the stream is read back and checked. Each kill
 * waits for observed progress (a share of the run acknowledged), so it lands mid-run on a machine
 * of any speed. The stream is deleted at the end unless `--keep`. Returns the exit code.
 */
export async function demo(args: readonly string[], cli: readonly string[]): Promise<number> {
  const { values } = parseArgs({
    args: [...args],
    options: {
      kills: { type: 'string', default: '3' },
      'per-run': { type: 'string', default: '20000' },
      keep: { type: 'boolean', default: false },
    },
  });
  const kills = Number(values.kills);
  const perRun = Number(values['per-run']);
  if (!Number.isInteger(kills) || kills < 0 || !Number.isInteger(perRun) || perRun < 100) {
    console.error('demo: --kills must be an integer ≥ 0 and --per-run an integer ≥ 100');
    return 2;
  }
  const stream = `stream-dedup-demo-${Date.now().toString(36)}`;
  console.log(`demo: producer "demo-producer" publishes ${perRun} messages per run into stream "${stream}";`);
  console.log(`demo: it is SIGKILLed ${kills} times mid-way and restarted on the same LevelDB store.`);
  const started = performance.now();
  try {
    const result = await runCrashScenario({
      cli,
      stream,
      producerName: 'demo-producer',
      kills,
      perRun,
      kill: { afterAcked: [0.1, 0.8] },
      onProgress: (line) => console.log(`demo: ${line}`),
    });
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    console.log(
      `demo: ${result.runs} runs, ${result.kills} kills, ${result.attempted} sends attempted, ` +
        `${result.acknowledged} acknowledged, ${result.resent} re-sent from the outbox, ` +
        `${result.streamMessages} messages in the stream (${seconds} s)`,
    );
    console.log(`audit: ${formatReport(result.report)}`);
    console.log(
      'audit: (recovered: unacknowledged at a kill, yet in the stream once; unacknowledged-missing: killed before reaching the outbox, never promised)',
    );
    const audit = result.audit;
    console.log(
      `audit: stream-dedup audit: ${audit.gaps} gaps, ${audit.duplicates} duplicates, ${audit.outOfOrder} out of order` +
        (audit.skippedIds > 0n ? `, ${audit.skippedIds} ids skipped by the producer (declared)` : ''),
    );
    const ok = result.report.ok && audit.ok;
    console.log(
      ok
        ? `audit: OK — ${result.report.lost.length} lost, ${result.report.duplicated.length} duplicated: every acknowledged message is in the stream exactly once`
        : 'audit: FAILED',
    );
    return ok ? 0 : 1;
  } finally {
    if (values.keep) {
      console.log(`demo: kept stream "${stream}" (delete it with rabbitmqctl delete_queue ${stream})`);
    } else {
      await deleteStream(connectionFromEnv(), stream).then(
        () => console.log(`demo: deleted stream "${stream}"`),
        (err: unknown) =>
          console.log(
            `demo: could not delete stream "${stream}" (${err instanceof Error ? err.message : String(err)}); ` +
              `delete it with rabbitmqctl delete_queue ${stream}`,
          ),
      );
    }
  }
}
