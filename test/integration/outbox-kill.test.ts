/**
 * The transactional outbox relay under process faults (issue 35), real broker and real PostgreSQL:
 * SIGKILLed 20 times at random while the application commits rows from 8 concurrent transactions
 * (1 in 5 rolling back, commits reordered against their INSERTs); and SIGSTOPped while it holds the
 * name, its sessions cut so a standby takes over, then SIGCONT (both may publish). After each, the
 * history check: every committed row in the stream once, none of a rolled-back transaction, each
 * key's rows in commit order.
 */
import { afterEach, describe, expect, it } from 'vitest';
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
import { formatReport } from '../../src/history/checker.js';

const client = useClient();
useRelayProcesses();
const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** A migrated schema with the truth table, a stream, and the application's enqueue. */
async function setUp(producerName: string) {
  const db = await useSchema();
  cleanups.push(db.drop);
  await createTruthTable(db.pool, db.schema);
  const stream = uniqueName('outbox-fault');
  await client().createStream({ stream, arguments: {} });
  cleanups.push(
    async () =>
      void (await client()
        .deleteStream({ stream })
        .catch(() => undefined)),
  );
  const outbox = PgOutbox.create({ schema: db.schema, producerName });
  const enqueue: Enqueue = (c, body, options) => outbox.enqueue(c, body, options);
  const plan = {
    url: PG_URL,
    schema: db.schema,
    producerName,
    stream,
    connection: { ...STREAM_CONNECTION },
    options: { pollIntervalMs: 200, takeoverIntervalMs: 200, batchSize: 50 },
  };
  return { ...db, stream, enqueue, plan };
}

describe('outbox relay - process faults', () => {
  it('20 SIGKILLs at random moments under 8 concurrent writers: every committed row once, none rolled back, keys in commit order', async () => {
    const started = performance.now();
    const { pool, schema, stream, enqueue, plan } = await setUp('outbox-kill');
    const stop = new AbortController();
    const app = runApplication({ pool, schema, enqueue, transactionsPerWorker: 10_000, signal: stop.signal });
    let kills = 0;
    let recovered = 0;
    let takeoverMs = 0;
    /** Lives killed before any confirm of their own (their recovery's re-sends, first numbering). */
    let early = 0;
    // The next lives start as standbys before the kill (a process takes ~3 s to open on a loaded
    // machine): SPARES of them start while the active one works, so that the starts overlap each
    // other and the kills (serial starts made this test 117–158 s). Whichever standby takes the
    // lock first is the next life.
    const SPARES = 3;
    const spares: RelayProcess[] = [];
    let current = new RelayProcess(plan);
    await current.waitFor((l) => l.event === 'active', 60_000, 'the first life active');
    while (kills < 20) {
      while (spares.length < SPARES) spares.push(new RelayProcess(plan));
      await Promise.any(spares.map((p) => p.waitFor((l) => l.ready === true, 60_000, 'open')));
      // Kill it while it works. Every other kill: after a confirm, 0–250 ms later (numbering,
      // sending, deleting and waiting for confirms all take turns in that window). The others: as
      // soon as this process sees it active (its recovery's re-sends written, its first numbering
      // under way); its first confirm often comes first all the same (a few ms), so how many
      // landed before one is counted and printed, not asserted.
      if (kills % 2 === 0) {
        await current.waitFor((l) => l.event === 'confirmed', 60_000, 'a confirm');
        await sleep(Math.random() * 250);
      } else {
        await current.waitFor((l) => l.event === 'active', 60_000, 'the take-over');
      }
      recovered += current.lines.filter(
        (l) => l.event === 'recovered' && Number(l.resent ?? 0) + Number(l.alreadyStored ?? 0) > 0,
      ).length;
      if (!current.lines.some((l) => l.event === 'confirmed')) early++;
      await current.kill();
      const killedAt = performance.now();
      kills++;
      const next = await Promise.any(
        spares.map((p) =>
          p.waitFor((l) => l.event === 'active', 60_000, 'the take-over').then((line) => ({ p, line })),
        ),
      );
      takeoverMs = Math.max(takeoverMs, next.line.at - killedAt);
      spares.splice(spares.indexOf(next.p), 1);
      current = next.p;
    }
    for (const p of spares) await p.kill();
    stop.abort();
    const result = await app;
    await waitForEmptyOutbox(pool, schema, plan.producerName);
    expect((await current.close())[0], current.stderr).toBe(0);

    const truth = await readTruth(pool, schema);
    const messages = await readAll(client(), stream);
    const report = checkOutbox(
      truth,
      result.rolledBack,
      messages.map((m) => m.content),
    );
    console.log(
      `[outbox kill] kills=${kills} (before a confirm: ${early}) longest take-over ${takeoverMs.toFixed(0)} ms, lives that recovered rows of a killed life=${recovered} committed txns=${result.committed} ` +
        `rows=${truth.length} rolled-back rows=${result.rolledBack.length} stream=${messages.length} ${formatReport(report)} ` +
        `in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    );
    expect(kills).toBe(20);
    // The documented bound after a killed relay (its sessions end at once): the standby's next try,
    // takeoverIntervalMs (200 here), plus its activation, whose broker connect is bounded by
    // connectTimeoutMs (10 000 by default).
    expect(takeoverMs).toBeLessThan(200 + 10_000);
    expect(truth.length).toBeGreaterThan(200);
    expect(result.rolledBack.length).toBeGreaterThan(0);
    expect(report.lost).toEqual([]);
    expect(report.duplicated).toEqual([]);
    expect(report.rolledBackSeen).toEqual([]);
    expect(report.orderViolations).toEqual([]);
    expect(report.ok).toBe(true);
    // The kills landed mid-flight: some life found rows an earlier one had numbered.
    expect(recovered).toBeGreaterThan(0);
  }, 300_000);

  it('SIGSTOP past the lock: a standby takes over, the stopped relay resumes (what it had on the wire may still land), every row once', async () => {
    const started = performance.now();
    const { pool, schema, stream, enqueue, plan } = await setUp('outbox-stop');
    const stop = new AbortController();
    const app = runApplication({ pool, schema, enqueue, transactionsPerWorker: 10_000, signal: stop.signal });
    const first = new RelayProcess({ ...plan, applicationName: 'outbox-stop-first' });
    await first.waitFor((l) => l.event === 'confirmed', 30_000, 'its first confirm');
    const standby = new RelayProcess({ ...plan, applicationName: 'outbox-stop-standby' });
    await standby.waitFor((l) => l.ready === true, 30_000, 'open');
    expect(standby.lines.some((l) => l.event === 'active')).toBe(false);
    first.child.kill('SIGSTOP');
    // Paused, it holds its sessions and their lock for ever; the server cuts them (as an
    // administrator, or a keepalive on a dead host would): the standby takes the name over.
    const cut = await pool.query<{ n: number }>(
      `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1`,
      ['outbox-stop-first'],
    );
    expect(cut.rows[0]!.n).toBeGreaterThan(0);
    const cutAt = performance.now();
    const active = await standby.waitFor((l) => l.event === 'active', 30_000, 'the take-over');
    await standby.waitFor((l) => l.event === 'confirmed', 30_000, 'a confirm after the take-over');
    first.child.kill('SIGCONT');
    await sleep(1_000);
    stop.abort();
    const result = await app;
    await waitForEmptyOutbox(pool, schema, plan.producerName);
    await first.close();
    expect((await standby.close())[0], standby.stderr).toBe(0);

    const truth = await readTruth(pool, schema);
    const messages = await readAll(client(), stream);
    const report = checkOutbox(
      truth,
      result.rolledBack,
      messages.map((m) => m.content),
    );
    const firstAfter = first.lines
      .filter((l) => l.at > cutAt)
      .map((l) => JSON.stringify({ ...l, at: Math.round(l.at - cutAt) }).slice(0, 300));
    const standbyAfter = standby.lines
      .filter((l) => l.at > cutAt && l.event !== 'confirmed')
      .map((l) => JSON.stringify({ ...l, at: Math.round(l.at - cutAt) }).slice(0, 300));
    console.log(`[outbox stop] first: ${firstAfter.join('\n')}\nstandby: ${standbyAfter.join('\n')}`);
    console.log(
      `[outbox stop] take-over ${(active.at - cutAt).toFixed(0)} ms after the cut; ` +
        `rows=${truth.length} stream=${messages.length} ${formatReport(report)} in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    );
    expect(report.ok, formatReport(report)).toBe(true);
    expect(report.rolledBackSeen).toEqual([]);
    // One active relay per name: resumed, its sessions gone, it must not take the name over while
    // the standby holds the lock (h/outbox 80cd47f: its cached lock connection, already terminated,
    // counted as held, and it bumped the epoch: 2 of 2 runs).
    expect(
      first.lines.filter((l) => l.at > cutAt && l.event === 'active'),
      'the resumed relay became active while the standby held the lock',
    ).toEqual([]);
  }, 120_000);
});
