import { describe, expect, it } from 'vitest';
import { auditRecords } from '../../src/cli/audit.js';
import { readIdentity, SKIP_HEADER } from '../../src/identity/headers.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import type { DedupPublisherOptions, OutgoingMessage, PublishTransport } from '../../src/publisher/types.js';
import type { DedupStore } from '../../src/store/store.js';
import { memoryDisk, memoryStore } from '../support/memory-store.js';
import { blind, ModelBroker, ModelTransport } from '../support/model-broker.js';

// Issue 16: the publisher's deliberate skips are declared in the stream (x-dedup-skip-from on the
// first message after them), so that audit tells them from loss; aborts leave no skip at all.

const body = (s: string): Buffer => Buffer.from(s);
const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

/** A model transport that records the headers on the wire and, while `losing`, drops messages. */
class WireTransport extends ModelTransport {
  losing = false;
  readonly wire: Array<{ id: bigint; skipFrom: string | undefined; lost: boolean }> = [];
  override publish(messages: readonly OutgoingMessage[]): Promise<void> {
    for (const m of messages) {
      this.wire.push({
        id: m.publishingId,
        skipFrom: m.headers?.[SKIP_HEADER] as string | undefined,
        lost: this.losing,
      });
    }
    return this.losing ? Promise.resolve() : super.publish(messages);
  }
}

const options = (more: Partial<DedupPublisherOptions> = {}): DedupPublisherOptions => ({
  producerName: 'p',
  store: undefined as unknown as DedupStore,
  durability: 'reserve',
  reserveBlock: 10,
  closeTimeoutMs: 0,
  reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
  ...more,
});

async function life(
  transport: PublishTransport,
  disk: ReturnType<typeof memoryDisk>,
  more: Partial<DedupPublisherOptions> = {},
) {
  return DedupPublisherCore.open(transport, options({ store: await memoryStore(disk), ...more }));
}

/** The broker's copy of the stream as audit records (identity stamps as the wire had them). */
function audit(broker: ModelBroker, transports: WireTransport[]) {
  const skips = new Map<bigint, string>();
  for (const t of transports)
    for (const w of t.wire) if (w.skipFrom !== undefined) skips.set(w.id, w.skipFrom);
  return auditRecords(
    broker.messages('orders').map((m, i) => ({
      offset: BigInt(i),
      applicationProperties: {
        'x-dedup-producer': m.producerName,
        'x-dedup-id': m.publishingId.toString(),
        ...(skips.has(m.publishingId) ? { [SKIP_HEADER]: skips.get(m.publishingId) } : {}),
      },
    })),
  );
}

const storedSkip = async (disk: ReturnType<typeof memoryDisk>) => {
  const store = await memoryStore(disk);
  const [p] = await store.listProducers();
  return p?.meta.skipFrom;
};

describe('skips (issue 16)', () => {
  it('a restart in reserve durability declares the rest of the block on its first message; audit is clean', async () => {
    const broker = new ModelBroker();
    const disk = memoryDisk();
    const t1 = new WireTransport(broker, 'orders', 'p');
    const a = await life(t1, disk);
    for (const m of ['m1', 'm2', 'm3']) await a.send(body(m));
    await a.close(); // as a crash: the block reserved up to 11 is left
    const t2 = new WireTransport(broker, 'orders', 'p');
    const b = await life(t2, disk);
    expect(await b.send(body('m12'))).toEqual({ publishingId: 12n, outcome: 'published' });
    await b.send(body('m13'));
    expect(t2.wire.map((w) => [w.id, w.skipFrom])).toEqual([
      [12n, '4'],
      [13n, undefined],
    ]);
    // Confirmed: the store forgets the skip (a reopen declares nothing more).
    while ((await storedSkip(disk)) !== undefined) await tick();
    await b.close();
    const report = audit(broker, [t1, t2]);
    expect(report).toMatchObject({ ok: true, gaps: 0, skippedIds: 8n });
  });

  it('a skip whose declaring message never reached the broker is declared again by the next life', async () => {
    for (const transport of ['stream', 'amqp'] as const) {
      const broker = new ModelBroker();
      const disk = memoryDisk();
      const wires: WireTransport[] = [];
      const open = (losing: boolean) => {
        const t = new WireTransport(broker, 'orders', 'p');
        t.losing = losing;
        wires.push(t);
        return life(
          transport === 'stream' ? t : blind(t),
          disk,
          transport === 'amqp' ? { durability: 'reserve' } : {},
        );
      };
      const a = await open(false);
      for (const m of ['m1', 'm2', 'm3']) await a.send(body(m));
      await a.close();
      const b = await open(true); // its first message (12, declaring 4..11) is lost
      const lost = b.send(body('m12'));
      while (wires[1]!.wire.length < 1) await tick();
      // Written before 12 left. Without the broker's last ID, the last ID below every unconfirmed
      // one when the block was reserved bounds it (0: m1 reserved the block before it left), so it
      // starts at 1: 1, 2 and 3 are in the stream, before the declaration (which is fine).
      const from = transport === 'stream' ? 4n : 1n;
      expect(await storedSkip(disk)).toBe(from);
      await b.close();
      await expect(lost).rejects.toMatchObject({ code: 'DEDUP_PUBLISHER_CLOSED' });
      const c = await open(false);
      const r = await c.send(body('m22'));
      await c.close();
      expect(wires[2]!.wire[0]).toEqual({ id: r.publishingId, skipFrom: String(from), lost: false });
      expect(audit(broker, wires), transport).toMatchObject({ ok: true, gaps: 0 });
    }
  });

  it('an adopting open re-assigns an outbox message that declared a skip without the declaration (adopting skips nothing)', async () => {
    const broker = new ModelBroker();
    const disk = memoryDisk();
    const a = await life(new WireTransport(broker, 'orders', 'p'), disk);
    for (const m of ['m1', 'm2', 'm3']) await a.send(body(m));
    await a.close(); // the block reserved up to 11 is left
    // An outbox life: its first message (12, declaring 4..11) stays in the outbox, lost on the wire.
    const t2 = new WireTransport(broker, 'orders', 'p');
    t2.losing = true;
    const b = await life(t2, disk, { durability: 'outbox' });
    const lost = b.send(body('m12'));
    while (t2.wire.length < 1) await tick();
    expect(t2.wire[0]).toMatchObject({ id: 12n, skipFrom: '4' });
    await b.close();
    await expect(lost).rejects.toMatchObject({ code: 'DEDUP_PUBLISHER_CLOSED' });
    // Another writer pushes the broker ahead; the next life adopts and re-sends m12 above it.
    broker.publish('orders', 'p', 500n, 'intruder');
    const t3 = new WireTransport(broker, 'orders', 'p');
    const c = await life(t3, disk, { durability: 'outbox', onBrokerAhead: 'adopt' });
    expect(c.report.reassigned).toBe(1);
    while (c.inFlight > 0) await tick();
    await c.close();
    expect(t3.wire.map((w) => [w.id, w.skipFrom])).toEqual([[501n, undefined]]);
  });

  it('outbox durability and explicit IDs never declare a skip', async () => {
    const broker = new ModelBroker();
    const disk = memoryDisk();
    const t1 = new WireTransport(broker, 'orders', 'p');
    const a = await life(t1, disk, { durability: 'outbox' });
    await a.send(body('m1'));
    await a.close();
    const t2 = new WireTransport(broker, 'orders', 'p');
    const b = await life(t2, disk, { durability: 'outbox' });
    await b.send(body('m2'));
    await b.close();
    expect([...t1.wire, ...t2.wire].every((w) => w.skipFrom === undefined)).toBe(true);
    const e1 = new WireTransport(broker, 'orders', 'e');
    const edisk = memoryDisk();
    const x = await DedupPublisherCore.open(
      e1,
      options({ producerName: 'e', idMode: 'explicit', store: await memoryStore(edisk) }),
    );
    await x.send(body('e1'), { publishingId: 1n });
    await x.close();
    const e2 = new WireTransport(broker, 'orders', 'e');
    const y = await DedupPublisherCore.open(
      e2,
      options({ producerName: 'e', idMode: 'explicit', store: await memoryStore(edisk) }),
    );
    await y.send(body('e2'), { publishingId: 2n });
    await y.close();
    expect([...e1.wire, ...e2.wire].every((w) => w.skipFrom === undefined)).toBe(true);
  });

  it('an aborted send that waits for room leaves no hole: later waiting sends move down', async () => {
    for (const idMode of ['auto', 'keyed'] as const) {
      const broker = new ModelBroker();
      const t = new WireTransport(broker, 'orders', 'p');
      const core = await DedupPublisherCore.open(
        t,
        options({ durability: 'outbox', idMode, maxInFlight: 1, store: await memoryStore() }),
      );
      t.faults.holdConfirms = true;
      const send = (label: string, signal?: AbortSignal) =>
        core.send(body(label), {
          ...(idMode === 'keyed' ? { key: label } : {}),
          ...(signal === undefined ? {} : { signal }),
        });
      const first = send('a');
      while (t.wire.length < 1) await tick();
      const controllers = [new AbortController(), new AbortController()];
      const b = send('b', controllers[0]!.signal);
      const c = send('c');
      const d = send('d', controllers[1]!.signal);
      const e = send('e');
      controllers[0]!.abort();
      controllers[1]!.abort();
      await expect(b).rejects.toMatchObject({ code: 'DEDUP_ABORTED' });
      await expect(d).rejects.toMatchObject({ code: 'DEDUP_ABORTED' });
      t.faults.holdConfirms = false;
      t.releaseConfirms();
      const results = await Promise.all([first, c, e]);
      expect(
        results.map((r) => r.publishingId),
        idMode,
      ).toEqual([1n, 2n, 3n]);
      expect(broker.messages('orders').map((m) => [m.publishingId, m.body])).toEqual([
        [1n, 'a'],
        [2n, 'c'],
        [3n, 'e'],
      ]);
      if (idMode === 'keyed') expect(await send('c')).toEqual({ publishingId: 2n, outcome: 'duplicate' });
      expect(core.lastPublishingId).toBe(3n);
      await core.close();
    }
  });

  it('a declaring send aborted while it waits for room hands its declaration to the send that takes its ID', async () => {
    const broker = new ModelBroker();
    const disk = memoryDisk();
    const wires: WireTransport[] = [];
    const open = async (more: Partial<DedupPublisherOptions>, losing = false) => {
      const t = new WireTransport(broker, 'orders', 'p');
      t.losing = losing;
      wires.push(t);
      return { t, core: await life(t, disk, more) };
    };
    // r1 reserves 2..11 and uses 1; r2 declares 2.. on 12, which is lost (the skip stays pending).
    const r1 = await open({});
    await r1.core.send(body('m1'));
    await r1.core.close();
    const r2 = await open({}, true);
    const lost12 = r2.core.send(body('m12'));
    while (r2.t.wire.length < 1) await tick();
    await r2.core.close();
    await expect(lost12).rejects.toMatchObject({ code: 'DEDUP_PUBLISHER_CLOSED' });
    // o3 (outbox) declares it again on 23, lost too: 23 stays in the outbox with its declaration.
    const o3 = await open({ durability: 'outbox' }, true);
    const lost23 = o3.core.send(body('m23'));
    while (o3.t.wire.length < 1) await tick();
    await o3.core.close();
    await expect(lost23).rejects.toMatchObject({ code: 'DEDUP_PUBLISHER_CLOSED' });
    expect(o3.t.wire[0]).toMatchObject({ id: 23n, skipFrom: '2' });
    // o4: the recovered 23 fills maxInFlight, so the next sends wait for room; the first of them
    // declares the pending skip again, and is aborted: its successor takes its ID and declaration.
    const o4 = await open({ durability: 'outbox', maxInFlight: 1 });
    o4.t.faults.holdConfirms = true;
    const abort = new AbortController();
    const b = o4.core.send(body('b'), { signal: abort.signal });
    const c = o4.core.send(body('c'));
    abort.abort();
    await expect(b).rejects.toMatchObject({ code: 'DEDUP_ABORTED' });
    o4.t.faults.holdConfirms = false;
    o4.t.releaseConfirms();
    expect(await c).toEqual({ publishingId: 24n, outcome: 'published' });
    expect(o4.t.wire.map((w) => [w.id, w.skipFrom])).toEqual([
      [23n, '2'],
      [24n, '2'],
    ]);
    while ((await storedSkip(disk)) !== undefined) await tick();
    await o4.core.close();
    expect(audit(broker, wires)).toMatchObject({ ok: true, gaps: 0 });
  });

  it('readIdentity reads a declaration, and refuses one that is not below the message ID', () => {
    const h = (skip: unknown) => ({ 'x-dedup-producer': 'p', 'x-dedup-id': '12', [SKIP_HEADER]: skip });
    expect(readIdentity(h('4'))).toEqual({
      kind: 'ok',
      identity: { producerName: 'p', publishingId: 12n, skippedFrom: 4n },
    });
    expect(readIdentity(h(Buffer.from('11')))).toMatchObject({ kind: 'ok', identity: { skippedFrom: 11n } });
    for (const bad of ['12', '13', '0', '-1', 'x', '', 4, null]) {
      expect(readIdentity(h(bad)), String(bad)).toMatchObject({
        kind: 'malformed',
        reason: expect.stringContaining(SKIP_HEADER) as string,
      });
    }
  });
});
