/**
 * Consumer groups on PostgreSQL (issue 34 item 4), against the real broker and the real server:
 * the members share the database (no changelog, nothing restored), each partition's batches are
 * transactions fenced on the partition's offset row. The handler uses the clock (each applied row
 * records Date.now()): with the effect and the fence in one transaction it need not be
 * deterministic. Each test has a schema and a super stream of its own, dropped at the end.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { PostgresStore, type PostgresTransaction } from '../../src/postgres.js';
import { SuperStreamVerifyingConsumer, type AssignmentEvent } from '../../src/stream.js';
import { Locator } from '../../src/superstream/partitions.js';
import { BROKER, STREAM_CONNECTION } from '../support/broker.js';
import { ledgerIds, publishLedger, type Sent } from '../support/group-ledger.js';
import { applyLedgerRow, createLedgerTables, ledgerFolds } from '../support/group-postgres.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
const cleanups: Array<() => Promise<void>> = [];
const children = new Set<ChildProcess>();
afterEach(async () => {
  for (const child of children) child.kill('SIGKILL');
  children.clear();
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function setUp(prefix: string) {
  const db = await useSchema();
  cleanups.push(db.drop);
  await createLedgerTables(db.pool, db.schema);
  const name = await superStream(prefix);
  const partitions = await client().queryPartitions({ superStream: name });
  return { ...db, name, partitions };
}

/** The exactly-once folds of what was sent, as `ledgerFolds` shows them. */
function expected(
  sent: Map<string, Sent>,
): Record<string, { balance: number; count: number; doubles: number }> {
  return Object.fromEntries(
    [...sent]
      .sort(([a], [b]) => (a < b ? -1 : 1))
      .map(([p, s]) => [p, { balance: s.balance, count: s.distinct, doubles: 0 }]),
  );
}

describe('SuperStreamVerifyingConsumer on PostgreSQL (shared database)', () => {
  it('two members on a 3-partition super stream: exact folds per partition in SQL, a hand-over when one closes, no changelog', async () => {
    const { pool, schema, name, partitions } = await setUp('pg-group');
    const sent = new Map<string, Sent>();
    const events: string[] = [];
    const takeOvers: number[] = [];
    const open = async (member: string): Promise<SuperStreamVerifyingConsumer> => {
      const store = await PostgresStore.open({ pool, schema });
      cleanups.push(() => store.close());
      const m = await SuperStreamVerifyingConsumer.open({
        superStream: name,
        consumerName: 'pg-ledger',
        store,
        connection: STREAM_CONNECTION,
        commitEvery: 20,
        handler: (message, tx, partition) =>
          applyLedgerRow((tx as unknown as PostgresTransaction).client, schema, partition, message),
        onAssignment: (e: AssignmentEvent) => {
          events.push(`${member} ${e.kind} ${e.partition.slice(name.length)}`);
          if (e.kind === 'assigned') takeOvers.push(e.ms);
        },
      });
      cleanups.push(() => m.close());
      return m;
    };
    const caughtUp = (members: SuperStreamVerifyingConsumer[]): Promise<unknown> =>
      Promise.all(
        [...sent].map(([p, s]) => Promise.any(members.map((m) => m.waitForOffset(p, s.lastOffset)))),
      );
    await publishLedger(client(), partitions, 1, 60, sent);
    const a = await open('A');
    await caughtUp([a]);
    expect(a.activePartitions()).toEqual(partitions);
    const b = await open('B');
    await publishLedger(client(), partitions, 61, 60, sent);
    await caughtUp([a, b]);
    expect(await ledgerFolds(pool, schema)).toEqual(expected(sent));
    // A leaves: B takes every partition over from the offset rows, nothing to restore.
    const heldByA = a.activePartitions();
    await a.close();
    await publishLedger(client(), partitions, 121, 60, sent);
    await caughtUp([b]);
    expect(b.activePartitions()).toEqual(partitions);
    expect(await ledgerFolds(pool, schema)).toEqual(expected(sent));
    // Every applied row was written once, with the clock's value at that time.
    const { rows } = await pool.query<{ n: string; stamped: string }>(
      `SELECT count(*) AS n, count(*) FILTER (WHERE at > 0) AS stamped FROM "${schema}".applied`,
    );
    expect(rows[0]).toEqual({ n: String(3 * 180), stamped: String(3 * 180) });
    expect(b.stats.entriesRestored).toBe(0);
    // No changelog stream was created.
    const locator = new Locator(STREAM_CONNECTION, 10_000);
    try {
      expect(await locator.existing(partitions.map((p) => `${p}.pg-ledger.changelog`))).toEqual(new Set());
    } finally {
      await locator.close();
    }
    expect(events.filter((e) => e.startsWith('B assigned')).length).toBeGreaterThanOrEqual(heldByA.length);
    await expect(b.readEffect(partitions[0]!, 'balance')).rejects.toBeInstanceOf(TypeError);
    console.log(
      `[pg group] take-overs (ms from activation): ${takeOvers.join(', ')}; events: ${events.join('; ')}`,
    );
  });

  it('a member paused (SIGSTOP) past its heartbeat mid-commit: its late batch rolls back, the other takes over, exact folds per partition', async () => {
    const { pool, schema, name, partitions } = await setUp('pg-group-pause');
    const dir = await tempDir();
    const pauseFile = join(dir, 'pause');
    const lines: Array<Record<string, unknown> & { at: number }> = [];
    const waiters = new Set<() => void>();
    const spawnMember = (member: string, env: Record<string, string>): ChildProcess => {
      const child = spawn(
        process.execPath,
        [
          '--import',
          'tsx',
          fileURLToPath(new URL('../fixtures/group-member-pg.ts', import.meta.url)),
          name,
          schema,
          member,
        ],
        {
          env: {
            ...process.env,
            RABBITMQ_STREAM_PORT: String(BROKER.streamPort),
            STREAM_DEDUP_PG_URL: PG_URL,
            ...env,
          },
          stdio: ['ignore', 'pipe', 'inherit'],
        },
      );
      children.add(child);
      void (async () => {
        for await (const text of createInterface({ input: child.stdout })) {
          lines.push({ ...(JSON.parse(text) as Record<string, unknown>), at: performance.now() });
          for (const w of waiters) w();
        }
      })();
      return child;
    };
    const until = (test: () => boolean, what: string, ms = 40_000): Promise<void> =>
      new Promise((resolve, reject) => {
        const check = (): void => {
          if (!test()) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`timed out waiting for ${what}; last lines: ${JSON.stringify(lines.slice(-15))}`));
        }, ms);
        waiters.add(check);
        check();
      });
    const committed = (member: string | undefined, p: string, offset: bigint, after = 0): boolean =>
      lines.some(
        (l) =>
          (member === undefined || l.member === member) &&
          l.commit === p &&
          l.at > after &&
          BigInt(String(l.lastOffset)) >= offset,
      );
    const sent = new Map<string, Sent>();
    await publishLedger(client(), partitions, 1, 40, sent);
    // A alone first: it holds every partition; then B joins and the broker gives it some.
    const a = spawnMember('A', { HEARTBEAT: '2', IDLE_TX_MS: '1500', PAUSE_FILE: pauseFile });
    await until(
      () => partitions.every((p) => committed('A', p, sent.get(p)!.lastOffset)),
      'A committing round 1',
    );
    const b = spawnMember('B', { HEARTBEAT: '2', IDLE_TX_MS: '1500' });
    await until(
      () => lines.some((l) => l.member === 'B' && l.kind === 'assigned'),
      'B being given a partition',
    );
    const heldByB = new Set(
      lines.filter((l) => l.member === 'B' && l.kind === 'assigned').map((l) => String(l.partition)),
    );
    const target = partitions.find((p) => !heldByB.has(p))!;
    // A stops itself at its commit of round 2's end in `target`, the batch's transaction open.
    const end = sent.get(target)!.lastOffset + BigInt(ledgerIds(41, 30).length);
    writeFileSync(pauseFile, `${target} ${end}`);
    await publishLedger(client(), partitions, 41, 30, sent);
    await until(() => lines.some((l) => l.member === 'A' && l.pausing === target), `A pausing at ${target}`);
    const stoppedAt = performance.now();
    // The broker gives A's partitions to B once A's heartbeat times out; B commits the same batch end.
    await until(
      () => committed('B', target, end, stoppedAt),
      `B taking ${target} over and committing it up to ${end}`,
    );
    const heldAfterMs = performance.now() - stoppedAt;
    a.kill('SIGCONT');
    const resumedAt = performance.now();
    await until(
      () =>
        lines.some(
          (l) => l.member === 'A' && l.kind === 'revoked' && l.partition === target && l.at > resumedAt,
        ),
      `A hearing it lost ${target}`,
    );
    await publishLedger(client(), partitions, 71, 40, sent);
    await until(
      () => partitions.every((p) => committed(undefined, p, sent.get(p)!.lastOffset)),
      'every partition committed to its end',
    );
    // A's late batch: the one it paused in. Its COMMIT never happened (rolled back: the server ended
    // its idle transaction, or the offset row had moved), so no commit line of A for `target` at
    // `end` after it resumed, before any new assignment of `target` to A.
    const afterResume = lines.filter((l) => l.member === 'A' && l.at > resumedAt);
    const late: unknown[] = [];
    for (const l of afterResume) {
      if (l.kind === 'assigned' && l.partition === target) break;
      if (l.commit === target) late.push(l.lastOffset);
    }
    const revoked = afterResume.find((l) => l.kind === 'revoked' && l.partition === target);
    a.kill('SIGTERM');
    b.kill('SIGTERM');
    const [[codeA], [codeB]] = (await Promise.all([once(a, 'exit'), once(b, 'exit')])) as [
      [number | null],
      [number | null],
    ];
    const stats = lines
      .filter((l) => l.stats !== undefined)
      .map((l) => `${String(l.member)} ${JSON.stringify(l.stats)}`);
    console.log(
      `[pg group pause] A paused ${(heldAfterMs / 1000).toFixed(1)} s at ${target.slice(name.length)} up to ${end}; ` +
        `late commits of A: ${late.length}; A's revocation: ${String(revoked?.reason)}; stats: ${stats.join('; ')}; ` +
        `A's errors: ${lines
          .filter((l) => l.member === 'A' && (l.failed !== undefined || l.error !== undefined))
          .map((l) => `${String(l.failed ?? l.error)} ${String(l.err)}`)
          .join(' | ')}; warnings of A after SIGCONT: ${afterResume
          .filter((l) => l.warn !== undefined)
          .map((l) => `${String(l.warn)} ${String(l.err)}`)
          .join(' | ')}`,
    );
    expect(late).toEqual([]);
    // Deterministic here: A resumes inside its commit, whose transaction the server ended 1.5 s
    // into the pause (idleInTransactionTimeoutMs) — rolled back and counted as a fence.
    const statsOfA = lines.find((l) => l.member === 'A' && l.stats !== undefined)?.stats as
      { fenced: number } | undefined;
    expect(statsOfA?.fenced).toBeGreaterThanOrEqual(1);
    expect({ codeA, codeB }).toEqual({ codeA: 0, codeB: 0 });
    expect(await ledgerFolds(pool, schema)).toEqual(expected(sent));
  });
});
