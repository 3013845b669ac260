import { join } from 'node:path';
import { connect, type Client, type ClientParams } from 'rabbitmq-stream-js-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkHistory, formatReport } from '../../src/testing.js';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { StreamDedupPublisher, type StreamDedupPublisherOptions } from '../../src/stream.js';
import { BROKER, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { FaultProxy } from '../support/proxy.js';
import { connectClient, readAll } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

let client: Client;
let proxy: FaultProxy;
beforeAll(async () => {
  client = await connectClient();
  proxy = await FaultProxy.start(BROKER.host, BROKER.streamPort);
});
afterAll(async () => {
  await proxy.close();
  await client.close();
});
const tempDir = useTempDir();

async function options(name: string): Promise<StreamDedupPublisherOptions> {
  const stream = uniqueName(name);
  await client.createStream({ stream, arguments: {} });
  return {
    // Every connection, the publisher's included, goes through the proxy.
    connection: {
      ...STREAM_CONNECTION,
      port: proxy.port,
      addressResolver: { enabled: true, endpoint: { host: '127.0.0.1', port: proxy.port } },
    },
    stream,
    producerName: `${name}-producer`,
    store: join(await tempDir(), 'store'),
    reconnect: { initialDelayMs: 50, maxDelayMs: 200 },
    // A connection the proxy accepts and closes never settles inside the client: bound each try.
    connectTimeoutMs: 1_000,
  };
}

async function audit(stream: string, labels: string[]): Promise<ReturnType<typeof checkHistory>> {
  const observed = (await readAll(client, stream)).map((m) => ({
    label: m.content.toString(),
    producerName: String(m.applicationProperties?.[PRODUCER_HEADER]),
    publishingId: BigInt(String(m.applicationProperties?.[ID_HEADER])),
  }));
  return checkHistory({ attempted: labels, acknowledged: labels, observed });
}

/** Sends `count` labelled messages at once; calls `at` when `trigger` of them have resolved. */
async function sendAll(
  pub: StreamDedupPublisher,
  count: number,
  trigger: number,
  at: () => void,
): Promise<{ labels: string[]; results: PromiseSettledResult<unknown>[] }> {
  const labels = Array.from({ length: count }, (_, i) => `m-${i + 1}`);
  let resolved = 0;
  const results = await Promise.allSettled(
    labels.map((label) =>
      pub.send(Buffer.from(label)).then((r) => {
        if (++resolved === trigger) at();
        return r;
      }),
    ),
  );
  return { labels, results };
}

describe('publisher - connection loss and broker outage', () => {
  it('cut connections and a refusing broker mid-stream: every send resolves, the stream holds each message once in order', async () => {
    const o = await options('cut');
    const pub = await StreamDedupPublisher.open(o);
    const before = proxy.connections;
    const { labels, results } = await sendAll(pub, 30_000, 5_000, () => {
      proxy.refuse(true);
      proxy.cut();
      setTimeout(() => proxy.refuse(false), 700);
    });
    expect(results.filter((r) => r.status === 'rejected')).toEqual([]);
    expect(proxy.connections).toBeGreaterThan(before + 1); // it did reconnect
    await pub.close();
    const report = await audit(o.stream, labels);
    console.log(`[cut] ${formatReport(report)}`);
    expect(report.ok).toBe(true);
    expect(report.lost).toEqual([]);
    expect(report.duplicated).toEqual([]);
  });

  it('a broker that stops reading: close() returns within closeTimeoutMs plus its bounded teardown, and the messages land from the outbox (issue 32, item 7)', async () => {
    const o = await options('undrained');
    const pub = await StreamDedupPublisher.open({ ...o, closeTimeoutMs: 200, confirmTimeoutMs: 60_000 });
    await pub.send(Buffer.from('m-0'));
    proxy.pause(true);
    // 32 MiB: more than the loopback socket buffers hold, so the publisher waits for 'drain'.
    const big = Buffer.alloc(256 * 1024, 1);
    const sends = Array.from({ length: 128 }, (_, i) =>
      pub.send(Buffer.concat([Buffer.from(`m-${i + 1}|`), big])),
    );
    for (const s of sends) s.catch(() => undefined);
    // Written to the store and handed to the transport, which waits for 'drain'.
    while (pub.stats.sent < 129) await new Promise((r) => setImmediate(r));
    const started = performance.now();
    let limit: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      pub.close().then(() => 'closed'),
      new Promise(
        (resolve) => (limit = setTimeout(() => resolve('close() still waiting after 30 s'), 30_000)),
      ),
    ]);
    clearTimeout(limit);
    const ms = performance.now() - started;
    console.log(`[undrained] close() returned in ${Math.round(ms)} ms`);
    expect(outcome).toBe('closed');
    // 200 ms for confirms; the undrained socket is destroyed at once (no deletePublisher), then
    // at most 5 s for the client's close, whose sockets are destroyed when it times out.
    expect(ms).toBeLessThan(7_000);
    // A paused reader sees our end only once it reads again.
    proxy.pause(false);
    for (let turn = 0; proxy.openConnections > 0 && turn < 10_000; turn++) {
      await new Promise((r) => setImmediate(r));
    }
    expect(proxy.openConnections, 'connections left open by close()').toBe(0);
    proxy.cut();
    const again = await StreamDedupPublisher.open(o);
    expect(
      again.openReport.resent +
        (await Promise.allSettled(sends)).filter((r) => r.status === 'fulfilled').length,
    ).toBeGreaterThanOrEqual(128);
    await again.close();
    const labels = (await readAll(client, o.stream)).map(
      (m) => m.content.subarray(0, 10).toString().split('|')[0]!,
    );
    expect(new Set(labels).size).toBe(129);
  }, 60_000);

  it('a hung connection: sends reject with DEDUP_CONFIRM_TIMEOUT, stay in the outbox, and still land exactly once', async () => {
    const o = await options('hang');
    const pub = await StreamDedupPublisher.open({ ...o, confirmTimeoutMs: 400 });
    await pub.send(Buffer.from('m-0'));
    proxy.stall(true);
    const stalled = await Promise.allSettled(
      Array.from({ length: 50 }, (_, i) => pub.send(Buffer.from(`m-${i + 1}`))),
    );
    expect(
      stalled.every(
        (r) => r.status === 'rejected' && (r.reason as { code?: string }).code === 'DEDUP_CONFIRM_TIMEOUT',
      ),
    ).toBe(true);
    proxy.stall(false);
    proxy.cut();
    // The timed-out messages are re-sent with their ids on the new connection; a later send
    // resolves only after them (the wire keeps ID order).
    expect((await pub.send(Buffer.from('m-51'))).publishingId).toBe(52n);
    await pub.close();
    const labels = Array.from({ length: 52 }, (_, i) => `m-${i}`);
    const report = await audit(o.stream, labels);
    expect(report.lost).toEqual([]);
    expect(report.duplicated).toEqual([]);
    expect(report.orderViolations).toEqual([]);
    // Nothing left in the outbox.
    const again = await StreamDedupPublisher.open(o);
    expect(again.openReport.resent).toBe(0);
    await again.close();
  });

  /**
   * Sends m-1, then cuts the proxy (refusing and stalling new connections) with m-2 in flight: m-2
   * must reject with DEDUP_BROKER_UNREACHABLE after giveUpAfterMs and stay in the outbox; a new
   * open (own connection) re-sends it, and m-1..m-3 are in the stream once each.
   */
  async function giveUpKeepsOutbox(
    o: StreamDedupPublisherOptions,
    connection: StreamDedupPublisherOptions['connection'],
  ): Promise<void> {
    const pub = await StreamDedupPublisher.open({
      ...o,
      connection,
      reconnect: { initialDelayMs: 20, maxDelayMs: 50, giveUpAfterMs: 300 },
    });
    try {
      await pub.send(Buffer.from('m-1'));
      proxy.refuse(true);
      proxy.stall(true);
      const pending = pub.send(Buffer.from('m-2'));
      proxy.cut();
      await expect(pending).rejects.toMatchObject({ code: 'DEDUP_BROKER_UNREACHABLE' });
      expect((await pub.closed())?.code).toBe('DEDUP_BROKER_UNREACHABLE');
    } finally {
      proxy.stall(false);
      proxy.refuse(false);
    }
    const again = await StreamDedupPublisher.open(o);
    expect(again.openReport.resent).toBe(1);
    expect((await again.send(Buffer.from('m-3'))).publishingId).toBe(3n);
    await again.close();
    const report = await audit(o.stream, ['m-1', 'm-2', 'm-3']);
    expect(report.ok).toBe(true);
    expect(report.lost).toEqual([]);
  }

  it('giving up after reconnect.giveUpAfterMs closes with DEDUP_BROKER_UNREACHABLE and keeps the outbox for the next open', async () => {
    const o = await options('giveup');
    await giveUpKeepsOutbox(o, o.connection);
  });

  it('on a shared Client whose connection is cut: gives up the same way, the outbox keeps the message', async () => {
    const o = await options('shared-cut');
    // The application's client, through the proxy like every connection of the test.
    const shared = await connect(o.connection as ClientParams);
    try {
      await giveUpKeepsOutbox(o, shared);
    } finally {
      await shared.close().catch(() => undefined);
    }
  });
});

describe('publisher - the stream deleted while open', () => {
  // createStream: true declares the stream at open() only: a reconnect must not bring it back
  // empty under the same name, with IDs going on where the deleted one ended.
  it.each([false, true])(
    'createStream %s: stops at once with DEDUP_BROKER_REFUSED naming the stream, not after giveUpAfterMs of retries',
    async (createStream) => {
      const o = await options(`deleted-${createStream}`);
      // Retrying for two minutes would outlast the test: the stop must come from the refusal.
      const pub = await StreamDedupPublisher.open({
        ...o,
        createStream,
        reconnect: { ...o.reconnect, giveUpAfterMs: 120_000 },
      });
      expect((await pub.send(Buffer.from('m-1'))).publishingId).toBe(1n);
      await client.deleteStream({ stream: o.stream });
      const started = performance.now();
      // Whatever the client hears first (the deletion, or a publish error), the next connect finds no stream.
      const late = pub.send(Buffer.from('m-2')).catch((err: unknown) => err);
      const closedWith = await pub.closed();
      expect(closedWith?.code).toBe('DEDUP_BROKER_REFUSED');
      expect(closedWith?.message).toContain(`stream "${o.stream}" no longer exists`);
      expect(await late).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
      expect(performance.now() - started).toBeLessThan(30_000);
      // Nothing re-created it: the broker's metadata says "does not exist" (response code 2).
      const [metadata] = await client.queryMetadata({ streams: [o.stream] });
      expect(metadata?.responseCode).toBe(2);
    },
  );
});
