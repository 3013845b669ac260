#!/usr/bin/env node
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { DedupError } from '../errors.js';
import { formatReport } from '../history/checker.js';
import { runCrashScenario } from './crash.js';
import { produce } from './produce.js';

const USAGE = `stream-dedup — producer-side deduplication for RabbitMQ Streams

Usage:
  stream-dedup demo [--kills N] [--per-run N]   publish, get SIGKILLed mid-way, restart, recover,
                                                then audit the stream: 0 lost, 0 duplicated
  stream-dedup help

The broker: RABBITMQ_HOST (127.0.0.1), RABBITMQ_STREAM_PORT (5552), RABBITMQ_USER / RABBITMQ_PASSWORD (guest).
Exit codes: 0 ok, 1 the audit found a problem, 2 usage, 3 broker unreachable or refused, 4 store locked or corrupt.`;

/** The command that starts this CLI again (under tsx when running from source). */
function selfCommand(): string[] {
  const self = fileURLToPath(import.meta.url);
  return self.endsWith('.ts') ? [process.execPath, '--import', 'tsx', self] : [process.execPath, self];
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'demo': {
      const { values } = parseArgs({
        args: rest,
        options: { kills: { type: 'string', default: '3' }, 'per-run': { type: 'string', default: '20000' } },
      });
      const kills = Number(values.kills);
      const perRun = Number(values['per-run']);
      if (!Number.isInteger(kills) || kills < 0 || !Number.isInteger(perRun) || perRun < 1) {
        console.error('demo: --kills must be an integer ≥ 0 and --per-run an integer ≥ 1');
        return 2;
      }
      const stream = `stream-dedup-demo-${Date.now().toString(36)}`;
      console.log(
        `demo: producer "demo-producer" publishes ${perRun} messages per run into stream "${stream}";`,
      );
      console.log(`demo: it is SIGKILLed ${kills} times mid-way and restarted on the same LevelDB store.`);
      const started = performance.now();
      const result = await runCrashScenario({
        cli: selfCommand(),
        stream,
        producerName: 'demo-producer',
        kills,
        perRun,
        minKillMs: 50,
        maxKillMs: 500,
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
        result.report.ok
          ? `audit: OK — ${result.report.lost.length} lost, ${result.report.duplicated.length} duplicated: every acknowledged message is in the stream exactly once`
          : 'audit: FAILED',
      );
      return result.report.ok ? 0 : 1;
    }
    case '_produce': {
      const { values } = parseArgs({
        args: rest,
        options: {
          stream: { type: 'string' },
          producer: { type: 'string' },
          store: { type: 'string' },
          run: { type: 'string' },
          count: { type: 'string' },
          log: { type: 'string' },
          durability: { type: 'string', default: 'outbox' },
          concurrency: { type: 'string', default: '64' },
          transport: { type: 'string', default: 'stream' },
        },
      });
      await produce({
        stream: values.stream!,
        producerName: values.producer!,
        store: values.store!,
        run: Number(values.run),
        count: Number(values.count),
        log: values.log!,
        durability: values.durability === 'reserve' ? 'reserve' : 'outbox',
        concurrency: Number(values.concurrency),
        transport: values.transport === 'amqp' ? 'amqp' : 'stream',
      });
      return 0;
    }
    case undefined:
    case 'help':
    case '--help':
      console.log(USAGE);
      return command === undefined ? 2 : 0;
    default:
      console.error(`unknown command ${command}\n\n${USAGE}`);
      return 2;
  }
}

function exitCodeOf(err: unknown): number {
  if (!(err instanceof DedupError)) return 1;
  if (err.code === 'DEDUP_BROKER_UNREACHABLE' || err.code === 'DEDUP_BROKER_REFUSED') return 3;
  if (err.code === 'DEDUP_STORE_LOCKED' || err.code === 'DEDUP_STORE_CORRUPT') return 4;
  return 1;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    // A clear line, not a stack trace, for the errors users meet (broker down, store locked).
    console.error(err instanceof DedupError ? `error: ${err.code}: ${err.message}` : err);
    process.exitCode = exitCodeOf(err);
  },
);
