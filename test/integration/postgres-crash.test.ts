/**
 * The verifying stream consumer on PostgreSQL SIGKILLed at 20 random moments (issue 34): inside the
 * handler, between the handler and COMMIT, during the commit's statements. The stream holds planted
 * copies and reordering; after the last life the SQL balances equal the exactly-once fold and no
 * (producer, ID) was applied twice. Real broker, real server, a schema of the test's own.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { identityHeaders } from '../../src/identity/headers.js';
import { uniqueName } from '../support/broker.js';
import { useSchema } from '../support/postgres.js';
import { useClient } from '../support/stream.js';

const CHILD = fileURLToPath(new URL('../support/pg-crash-child.ts', import.meta.url));
const client = useClient();
const drops: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const drop of drops) await drop();
});

/** Runs one life; resolves with how it ended. */
async function life(
  plan: object,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', CHILD, JSON.stringify(plan)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
  return { code, signal, out };
}

describe('verifying consumer on PostgreSQL - crash and restart', () => {
  it('postgres - 20 SIGKILLs (in the handler, before COMMIT, during the commit) leave the exactly-once fold', async () => {
    const { pool, schema, drop } = await useSchema();
    drops.push(drop);
    await pool.query(`CREATE TABLE "${schema}".balances (account text PRIMARY KEY, amount bigint NOT NULL)`);
    await pool.query(`CREATE TABLE "${schema}".applied (producer text NOT NULL, id bigint NOT NULL)`);
    const stream = uniqueName('pg-crash');
    await client().createStream({ stream, arguments: {} });
    // 3 producers × 100 IDs; neighbours swapped (reordering within the window) and 1 in 5 sent again later.
    const sent: Array<{ producer: string; id: number; amount: number; account: string }> = [];
    for (let id = 1; id <= 100; id++) {
      for (const producer of ['p0', 'p1', 'p2']) {
        sent.push({ producer, id, amount: id * 7 + producer.charCodeAt(1), account: `acc-${(id * 13) % 5}` });
      }
    }
    for (let i = 0; i + 5 < sent.length; i += 4) [sent[i], sent[i + 5]] = [sent[i + 5]!, sent[i]!];
    const copies = sent.filter((_, i) => i % 5 === 2);
    const messages = [...sent.slice(0, 150), ...copies.slice(0, 30), ...sent.slice(150), ...copies.slice(30)];
    const publisher = await client().declarePublisher({ stream });
    for (const m of messages) {
      await publisher.send(Buffer.from(JSON.stringify({ account: m.account, amount: m.amount })), {
        applicationProperties: identityHeaders(m.producer, BigInt(m.id)),
      });
    }
    await publisher.flush();
    await publisher.close();
    const lastOffset = String(messages.length - 1);

    const phases = ['handler', 'before-commit', 'during-commit'] as const;
    let kills = 0;
    let lives = 0;
    const byPhase: Record<string, number> = {};
    while (kills < 20) {
      const phase = phases[kills % 3]!;
      const plan = {
        stream,
        schema,
        phase,
        // At most 14 new messages a life: 20 lives stay short of the 300 new messages (the last life finishes).
        after: 1 + Math.floor(Math.random() * 14),
        commitEvery: 1 + Math.floor(Math.random() * 16),
        lastOffset,
      };
      const ended = await life(plan);
      lives++;
      if (ended.signal === 'SIGKILL') {
        kills++;
        byPhase[phase] = (byPhase[phase] ?? 0) + 1;
      } else {
        // It reached the end before its kill: nothing more to kill.
        expect(ended.code, ended.out).toBe(0);
        break;
      }
    }
    const last = await life({ stream, schema, phase: 'none', after: 0, commitEvery: 10, lastOffset });
    expect(last.code, last.out).toBe(0);
    console.log(`[pg crash] lives=${lives + 1} kills=${kills} by phase=${JSON.stringify(byPhase)}`);
    expect(kills).toBe(20);

    const fold: Record<string, number> = {};
    for (const m of sent) fold[m.account] = (fold[m.account] ?? 0) + m.amount;
    const { rows } = await pool.query<{ account: string; amount: string }>(
      `SELECT account, amount FROM "${schema}".balances`,
    );
    expect(Object.fromEntries(rows.map((r) => [r.account, Number(r.amount)]))).toEqual(fold);
    const twice = await pool.query(
      `SELECT producer, id, count(*) FROM "${schema}".applied GROUP BY producer, id HAVING count(*) > 1`,
    );
    expect(twice.rows).toEqual([]);
    const applied = await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".applied`);
    expect(applied.rows[0]!.n).toBe(sent.length);
    await client().deleteStream({ stream });
  }, 600_000);
});
