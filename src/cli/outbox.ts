/**
 * `stream-dedup outbox status`: the transactional outbox of a PostgreSQL schema (rows waiting, the
 * oldest one's age, the relay holding the lock, the last published ID per target). The reading is
 * src/postgres/outbox-status.ts, loaded only for this command (nothing else of the CLI needs `pg`).
 */
import { parseArgs } from 'node:util';
import { DedupError } from '../errors.js';
import type { OutboxStatus } from '../postgres/outbox-status.js';

export const OUTBOX_USAGE =
  'usage: stream-dedup outbox status --postgres URL --schema S [--producer NAME] [--json]   (stream-dedup help for more)';

/** A duration in words: `850 ms`, `12.3 s`, `4 min 05 s`, `3 h 07 min`. */
export function formatAge(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1_000).toFixed(1)} s`;
  const s = Math.floor(ms / 1_000);
  if (s < 3_600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(s / 3_600)} h ${String(Math.floor((s % 3_600) / 60)).padStart(2, '0')} min`;
}

/** The status as text, one block per producer name. */
export function formatOutboxStatus(status: OutboxStatus): string {
  if (status.producers.length === 0)
    return `schema ${status.schema}: the outbox is empty and no relay ever ran`;
  const lines: string[] = [];
  for (const p of status.producers) {
    lines.push(`producer ${p.producerName}`);
    lines.push(
      `  rows waiting:   ${p.waiting}${p.numbered > 0 ? ` (${p.numbered} numbered, sent or to re-send, not confirmed)` : ''}`,
    );
    lines.push(`  oldest:         ${p.oldestAgeMs === undefined ? '-' : `${formatAge(p.oldestAgeMs)} ago`}`);
    if (p.relay === undefined) lines.push('  relay:          none ever took the name over');
    else {
      const session =
        p.relay.session === undefined
          ? ''
          : `, session pid ${p.relay.session.pid}${p.relay.session.clientAddress === null ? '' : ` from ${p.relay.session.clientAddress}`}`;
      lines.push(
        p.relay.holdsLock
          ? `  relay:          ${p.relay.holder} holds the lock (epoch ${p.relay.epoch}, since ${p.relay.since.toISOString()}${session})`
          : `  relay:          none holds the lock (the last, ${p.relay.holder}, epoch ${p.relay.epoch}, took over ${p.relay.since.toISOString()})`,
      );
    }
    if (p.targets.length === 0) lines.push('  last published: -');
    for (const t of p.targets) {
      lines.push(
        `  last published: ${t.target} ${t.lastConfirmed}${t.lastAssigned === t.lastConfirmed ? '' : ` (numbered through ${t.lastAssigned})`}`,
      );
    }
  }
  return lines.join('\n');
}

/** The status as one JSON object (64-bit integers as decimal strings, times in ISO 8601). */
export function formatOutboxStatusJson(status: OutboxStatus): string {
  return JSON.stringify(status, (_, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
}

/**
 * Runs `stream-dedup outbox <sub-command> …`; returns the exit code: 0 ok, 2 usage, 4 the server
 * refused (password, database, missing schema, another version) or no row, relay or ID of
 * `--producer` is in the schema.
 */
export async function outboxCommand(args: readonly string[]): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === '--help' || sub === '-h' || sub === 'help') {
    console.log(OUTBOX_USAGE);
    return 0;
  }
  if (sub !== 'status') {
    console.error(
      `outbox: ${sub === undefined ? 'no sub-command' : `unknown sub-command ${sub}`}\n${OUTBOX_USAGE}`,
    );
    return 2;
  }
  let values;
  try {
    ({ values } = parseArgs({
      args: [...rest],
      options: {
        postgres: { type: 'string' },
        schema: { type: 'string' },
        producer: { type: 'string' },
        json: { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (err) {
    console.error(`outbox status: ${(err as Error).message}\n${OUTBOX_USAGE}`);
    return 2;
  }
  if (values.help === true) {
    console.log(OUTBOX_USAGE);
    return 0;
  }
  const url = values.postgres ?? process.env.STREAM_DEDUP_PG_URL ?? process.env.DATABASE_URL;
  if (url === undefined || url === '') {
    console.error(
      `outbox status: no database URL: pass --postgres, or set STREAM_DEDUP_PG_URL or DATABASE_URL\n${OUTBOX_USAGE}`,
    );
    return 2;
  }
  if (values.schema === undefined) {
    console.error(`outbox status: --schema is required\n${OUTBOX_USAGE}`);
    return 2;
  }
  const { readOutboxStatus } = await import('../postgres/outbox-status.js');
  let status: OutboxStatus;
  try {
    status = await readOutboxStatus(url, values.schema, {
      ...(values.producer === undefined ? {} : { producerName: values.producer }),
    });
  } catch (err) {
    if (err instanceof TypeError || err instanceof RangeError) {
      console.error(`outbox status: ${err.message}`);
      return 2;
    }
    if (err instanceof DedupError) {
      console.error(`error: ${err.code}: ${err.message.replace(/\s*\n\s*/g, ' ')}`);
      return 4;
    }
    throw err;
  }
  if (values.producer !== undefined && status.producers.length === 0) {
    console.error(
      `error: schema ${values.schema} has no outbox row, relay or ID of producer ${values.producer}`,
    );
    return 4;
  }
  console.log(values.json === true ? formatOutboxStatusJson(status) : formatOutboxStatus(status));
  return 0;
}
