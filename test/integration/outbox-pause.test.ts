/**
 * A SIGSTOPped relay (paused, not dead) loses the producer name within its lease (issue 35 item 5,
 * docs/design.md §14 "the lease"), real broker, real PostgreSQL, relays as child processes: nothing
 * ends its sessions from outside. The paused relay's lock session runs with
 * `idle_session_timeout = leaseTimeoutMs`; without its heartbeat the server ends it, the locks go,
 * the standby takes over. Then SIGCONT: the woken relay numbers and deletes nothing under its old
 * lease (the epoch fences both in the statement that would), what it still had on the wire is
 * deduplicated, and it becomes the standby. Three pauses, roles swapping, under 8 concurrent
 * writers (1 in 5 rolling back); then the history check: every committed row in the stream once,
 * none rolled back, keys in commit order.
 */
import type pg from 'pg';
import { afterEach, describe, expect, it } from 'vitest';
import { formatReport } from '../../src/history/checker.js';
import { PgOutbox } from '../../src/postgres.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import {
  checkOutbox,
  createTruthTable,
  readTruth,
  runApplication,
  type Enqueue,
} from '../support/outbox-app.js';
import { RelayProcess, useRelayProcesses, waitForEmptyOutbox } from '../support/outbox-relay.js';
import { PG_URL, useSchema } from '../support/postgres.js';
import { readAll, useClient } from '../support/stream.js';

const client = useClient();
useRelayProcesses();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Logs, per statement, who numbered (moved outbox rows into batch records) or deleted batch
 * records, or took the lease over, with the lease epoch committed at that moment (a fresh snapshot
 * per statement in the trigger).
 */
async function logRelayOps(pool: pg.Pool, schema: string): Promise<void> {
  const s = `"${schema}"`;
  await pool.query(`
    CREATE TABLE ${s}.relay_ops (at timestamptz NOT NULL DEFAULT clock_timestamp(), app text, op text, epoch bigint);
    CREATE FUNCTION ${s}.log_outbox_op() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM changed) THEN
        INSERT INTO ${s}.relay_ops (app, op, epoch)
        VALUES (current_setting('application_name'), TG_OP, (SELECT max(epoch) FROM ${s}.outbox_relays));
      END IF;
      RETURN NULL;
    END $$;
    CREATE TRIGGER log_moves AFTER DELETE ON ${s}.outbox REFERENCING OLD TABLE AS changed
      FOR EACH STATEMENT EXECUTE FUNCTION ${s}.log_outbox_op();
    CREATE TRIGGER log_numbering AFTER INSERT ON ${s}.outbox_batches REFERENCING NEW TABLE AS changed
      FOR EACH STATEMENT EXECUTE FUNCTION ${s}.log_outbox_op();
    CREATE TRIGGER log_deletes AFTER DELETE ON ${s}.outbox_batches REFERENCING OLD TABLE AS changed
      FOR EACH STATEMENT EXECUTE FUNCTION ${s}.log_outbox_op();
    CREATE FUNCTION ${s}.log_takeover() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO ${s}.relay_ops (app, op, epoch) VALUES (current_setting('application_name'), 'takeover', NEW.epoch);
      RETURN NULL;
    END $$;
    CREATE TRIGGER log_takeover AFTER INSERT OR UPDATE ON ${s}.outbox_relays
      FOR EACH ROW EXECUTE FUNCTION ${s}.log_takeover();`);
}

const LEASE_MS = 2_000;
const TAKEOVER_INTERVAL_MS = 200;
const PAUSES = 3;

describe('outbox relay - SIGSTOP within the lease', () => {
  it('a paused relay loses the name within leaseTimeoutMs, numbers and deletes nothing once woken; every row once', async () => {
    const started = performance.now();
    const producerName = uniqueName('outbox-pause');
    const db = await useSchema();
    cleanups.push(db.drop);
    await createTruthTable(db.pool, db.schema);
    const stream = uniqueName('outbox-pause');
    await client().createStream({ stream, arguments: {} });
    cleanups.push(
      async () =>
        void (await client()
          .deleteStream({ stream })
          .catch(() => undefined)),
    );
    await logRelayOps(db.pool, db.schema);
    const outbox = PgOutbox.create({ schema: db.schema, producerName });
    const enqueue: Enqueue = (c, body, options) => outbox.enqueue(c, body, options);
    const plan = {
      url: PG_URL,
      schema: db.schema,
      producerName,
      stream,
      connection: { ...STREAM_CONNECTION },
      options: {
        pollIntervalMs: 200,
        takeoverIntervalMs: TAKEOVER_INTERVAL_MS,
        batchSize: 50,
        leaseTimeoutMs: LEASE_MS,
      },
    };
    const stop = new AbortController();
    const app = runApplication({
      pool: db.pool,
      schema: db.schema,
      enqueue,
      transactionsPerWorker: 10_000,
      signal: stop.signal,
    });
    let active = new RelayProcess({ ...plan, applicationName: 'outbox-pause-a' });
    await active.waitFor((l) => l.event === 'active', 60_000, 'the first life active');
    let standby = new RelayProcess({ ...plan, applicationName: 'outbox-pause-b' });
    // Before the schema is dropped (cleanups run last first): a relay left SIGSTOPped by a failed
    // assertion would hold its tables' locks and the DROP would wait.
    cleanups.push(async () => {
      for (const p of [active, standby])
        if (p.child.exitCode === null && p.child.signalCode === null) await p.kill();
    });
    await standby.waitFor((l) => l.ready === true, 60_000, 'the standby open');
    const takeovers: number[] = [];
    const woken: string[] = [];
    const fenced: string[] = [];
    for (let round = 0; round < PAUSES; round++) {
      const activeLines = active.lines.length;
      await active.waitFor(
        (l) => l.event === 'confirmed' && active.lines.indexOf(l) >= activeLines,
        60_000,
        'a confirm',
      );
      await sleep(Math.random() * 100);
      active.child.kill('SIGSTOP');
      const pausedAt = performance.now();
      const fromLine = standby.lines.length;
      const line = await standby.waitFor(
        (l) => l.event === 'active' && standby.lines.indexOf(l) >= fromLine,
        LEASE_MS + 20_000,
        'the take-over',
      );
      takeovers.push(line.at - pausedAt);
      await standby.waitFor(
        (l) => l.event === 'confirmed' && standby.lines.indexOf(l) >= fromLine,
        30_000,
        'a confirm after it',
      );
      // Woken: it finds its lock session ended and becomes the standby. Whatever it does meanwhile,
      // it must not confirm (delete) nor take the name while the other holds it.
      const wokenFrom = active.lines.length;
      active.child.kill('SIGCONT');
      await active.waitFor(
        (l) => l.event === 'retrying' && active.lines.indexOf(l) >= wokenFrom,
        30_000,
        'the woken relay to notice',
      );
      await sleep(500);
      // (A 'confirmed' may still come: the answer to a DELETE the server ran before the pause.)
      woken.push(
        ...active.lines
          .slice(wokenFrom)
          .filter((l) => l.event === 'active' || l.stopped !== undefined)
          .map((l) => JSON.stringify(l).slice(0, 200)),
      );
      fenced.push(
        ...active.lines
          .slice(wokenFrom)
          .filter((l) => l.event === 'retrying')
          .map((l) => String((l.error as { message?: string } | undefined)?.message).slice(0, 80)),
      );
      [active, standby] = [standby, active];
    }
    stop.abort();
    const result = await app;
    await waitForEmptyOutbox(db.pool, db.schema, producerName);
    expect((await active.close())[0], active.stderr).toBe(0);
    expect((await standby.close())[0], standby.stderr).toBe(0);

    const truth = await readTruth(db.pool, db.schema);
    const messages = await readAll(client(), stream);
    const report = checkOutbox(
      truth,
      result.rolledBack,
      messages.map((m) => m.content),
    );
    console.log(
      `[outbox pause] lease ${LEASE_MS} ms, take-overs after SIGSTOP: ${takeovers.map((t) => t.toFixed(0)).join(', ')} ms; ` +
        `rows=${truth.length} rolled-back rows=${result.rolledBack.length} stream=${messages.length} ${formatReport(report)} ` +
        `in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    );
    console.log(`[outbox pause] the woken relays' first failures: ${fenced.join(' | ')}`);
    expect(woken, 'the woken relay took the name while the other held it, or stopped').toEqual([]);
    // The fence, as the server saw it: every numbering (the move) and delete of batch records ran in a
    // session of the relay whose take-over set the lease epoch current at that statement.
    const ops = await db.pool.query<{ app: string; op: string; epoch: string; owner: string | null }>(
      `SELECT o.app, o.op, o.epoch, t.app AS owner FROM "${db.schema}".relay_ops o
         LEFT JOIN "${db.schema}".relay_ops t ON t.op = 'takeover' AND t.epoch = o.epoch
        WHERE o.op <> 'takeover' ORDER BY o.at`,
    );
    const strays = ops.rows.filter((o) => o.app !== o.owner);
    console.log(
      `[outbox pause] ${ops.rows.length} numbering/delete statements logged, ${strays.length} under a lease the session did not hold`,
    );
    expect(ops.rows.length).toBeGreaterThan(10);
    expect(strays).toEqual([]);
    expect(report.lost).toEqual([]);
    expect(report.duplicated).toEqual([]);
    expect(report.rolledBackSeen).toEqual([]);
    expect(report.orderViolations).toEqual([]);
    expect(report.ok).toBe(true);
    expect(truth.length).toBeGreaterThan(100);
    // The bound: the lease, the standby's next try, its activation (broker connect and recovery).
    // Not before the lease could have run out: the server ends the session a lease after the last
    // heartbeat, which came up to one heartbeat period (lease / 5) before the SIGSTOP, or two when a
    // tick was skipped on a busy relay (1 881 ms seen in CI against the former 0.8 × lease). A
    // take-over that ignored the lease lands within takeoverIntervalMs and a connect.
    for (const t of takeovers) expect(t).toBeGreaterThan(LEASE_MS / 2);
    for (const t of takeovers) expect(t).toBeLessThan(LEASE_MS + TAKEOVER_INTERVAL_MS + 5_000);
  }, 180_000);
});
