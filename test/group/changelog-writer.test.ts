import { describe, expect, it, vi } from 'vitest';
import {
  ChangelogWriter,
  checkChangelogWritable,
  type ChangelogTransport,
} from '../../src/group/changelog-writer.js';
import { DedupError } from '../../src/errors.js';
import type { TransportHandlers } from '../../src/publisher/types.js';
import { silentLogger } from '../../src/telemetry/logger.js';
import { StreamDoesNotExistError, StreamNotAvailableError } from '../../src/transport/util.js';

/** What the stream transport throws when the broker refuses the producer's declaration. */
function refusedDeclare(cause: Error): DedupError {
  return new DedupError(
    'DEDUP_BROKER_REFUSED',
    `the broker refused producer "stream-dedup.changelog.billing" on stream "orders-0.billing.changelog": ${cause.message}`,
    { cause },
  );
}

/** A transport whose connects answer `outcomes` in turn (then succeed), and confirms every publish. */
function modelTransport(outcomes: Array<Error | undefined>): ChangelogTransport & { connects: number } {
  let handlers: TransportHandlers | undefined;
  let lastId = 0n;
  const transport = {
    connects: 0,
    maxMessageBytes: 1 << 20,
    connect(h: TransportHandlers): Promise<bigint> {
      const outcome = outcomes[transport.connects++];
      if (outcome !== undefined) return Promise.reject(outcome);
      handlers = h;
      return Promise.resolve(lastId);
    },
    publish(messages: readonly { publishingId: bigint }[]): Promise<void> {
      for (const m of messages) if (m.publishingId > lastId) lastId = m.publishingId;
      queueMicrotask(() => handlers?.confirmed(messages.map((m) => m.publishingId)));
      return Promise.resolve();
    },
    queryLastId: () => Promise.resolve(lastId),
    close: () => Promise.resolve(),
  };
  return transport;
}

function writer(transport: ChangelogTransport, appendTimeoutMs = 2_000): ChangelogWriter {
  return new ChangelogWriter({
    stream: 'orders-0.billing.changelog',
    producerName: 'stream-dedup.changelog.billing',
    connection: undefined,
    connectTimeoutMs: 1_000,
    appendTimeoutMs,
    reconnect: { initialDelayMs: 1, maxDelayMs: 5 },
    logger: silentLogger,
    transport,
  });
}

describe('changelog writer - permanent refusals', () => {
  it('rejects with DEDUP_BROKER_REFUSED at the first refused connect, keeping the broker response code (was DEDUP_BROKER_UNREACHABLE after appendTimeoutMs)', async () => {
    const accessRefused = new Error('Declare Publisher command returned error with code 16 - Access Refused');
    const transport = modelTransport(Array<Error>(1_000).fill(refusedDeclare(accessRefused)));
    const started = performance.now();
    const err: unknown = await writer(transport)
      .append(Buffer.from('entry'), 2n, () => true)
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((err as Error).message).toMatch(/access refused \(broker response code 16\)/);
    expect((err as Error).cause).toBeInstanceOf(DedupError);
    expect(transport.connects).toBe(1);
    expect(performance.now() - started).toBeLessThan(1_000);
  });

  it('rejects with DEDUP_BROKER_REFUSED when the changelog does not exist because its create was refused', async () => {
    // As StreamTransport reports it: the declaration's "does not exist", and the create's own error.
    const declare = new Error('Declare Publisher command returned error with code 2 - Stream does not exist');
    const create = new Error('Create Stream command returned error with code 16 - access refused');
    const missing = new StreamDoesNotExistError('the stream does not exist, and creating it failed', {
      cause: new AggregateError([declare, create]),
    });
    const transport = modelTransport(Array<Error>(1_000).fill(refusedDeclare(missing)));
    const err: unknown = await writer(transport)
      .append(Buffer.from('entry'), 2n, () => true)
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((err as Error).message).toMatch(/access refused \(broker response code 16\)/);
    expect(transport.connects).toBe(1);
  });

  it('retries a changelog that does not exist yet because its create failed for a moment (a coordinator election), and lands the entry', async () => {
    // A rolling restart: the create times out, the declaration truthfully says "does not exist";
    // the next connect creates it. Stopping the member here stopped healthy groups (hostile review).
    const missing = new StreamDoesNotExistError('the stream does not exist, and creating it failed', {
      cause: new AggregateError([
        new Error('Declare Publisher command returned error with code 2 - Stream does not exist'),
        new Error('timed out creating stream "orders-0.billing.changelog"'),
      ]),
    });
    const transport = modelTransport([refusedDeclare(missing), refusedDeclare(missing)]);
    await expect(writer(transport).append(Buffer.from('entry'), 2n, () => true)).resolves.toBe('landed');
    expect(transport.connects).toBe(3);
  });

  it('retries failures that pass (a leader election, a node that does not answer) and lands the entry', async () => {
    const election = refusedDeclare(
      new StreamNotAvailableError('the stream has no leader available right now'),
    );
    const down = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5552'), { code: 'ECONNREFUSED' });
    const transport = modelTransport([election, down, election]);
    await expect(writer(transport).append(Buffer.from('entry'), 2n, () => true)).resolves.toBe('landed');
    expect(transport.connects).toBe(4);
  });
});

describe('changelog writer - the write check at open()', () => {
  /** A transport whose connect fails with `error` (or answers), and that records its calls. */
  function checkTransport(error?: Error) {
    const calls = { connect: 0, close: 0 };
    const transport: ChangelogTransport = {
      connect: () => {
        calls.connect++;
        return error === undefined ? Promise.resolve(0n) : Promise.reject(error);
      },
      publish: () => Promise.reject(new Error('the check writes nothing')),
      queryLastId: () => Promise.resolve(0n),
      close: () => {
        calls.close++;
        return Promise.resolve();
      },
      maxMessageBytes: 1_000_000,
    };
    return { transport, calls };
  }
  const options = {
    stream: 'orders-0.billing.changelog',
    producerName: 'stream-dedup.changelog.billing',
    connection: undefined,
    connectTimeoutMs: 1_000,
  };

  it('rejects with DEDUP_BROKER_REFUSED and the code when the named producer is refused (no write permission)', async () => {
    const { transport, calls } = checkTransport(
      new Error('Declare Publisher command returned error with code 16 - access refused'),
    );
    const err: unknown = await checkChangelogWritable({ ...options, exists: true, transport }).catch(
      (e: unknown) => e,
    );
    expect(err).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((err as Error).message).toMatch(/access refused \(broker response code 16\)/);
    await vi.waitFor(() => expect(calls.close).toBe(1));
  });

  it('leaves a failure that may pass to the first append, and closes its connection after a check that passed', async () => {
    const passing = checkTransport(new StreamNotAvailableError('no leader right now'));
    await expect(
      checkChangelogWritable({ ...options, exists: true, transport: passing.transport }),
    ).resolves.toBe(undefined);
    const ok = checkTransport();
    await checkChangelogWritable({ ...options, exists: true, transport: ok.transport });
    await vi.waitFor(() => expect(ok.calls.close).toBe(1));
  });

  it('does not connect to a changelog the metadata did not answer for (never creates one)', async () => {
    const { transport, calls } = checkTransport();
    await checkChangelogWritable({ ...options, exists: false, transport });
    expect(calls.connect).toBe(0);
  });
});

describe('changelog writer - pipelined appends (appendsInFlight, design §12)', () => {
  /**
   * A broker under the test's hand: publishes are recorded per connection, the broker keeps an ID
   * only above its last one (other members' entries via `otherWrites`), and confirms wait for
   * `confirmAll()`.
   */
  function heldTransport() {
    let handlers: TransportHandlers | undefined;
    const state = {
      lastId: 0n,
      connects: 0,
      sent: [] as Array<{ connection: number; id: bigint }>,
      unconfirmed: [] as bigint[],
      queries: 0,
    };
    const transport: ChangelogTransport = {
      maxMessageBytes: 1 << 20,
      connect(h) {
        state.connects++;
        handlers = h;
        state.unconfirmed = [];
        return Promise.resolve(state.lastId);
      },
      publish(messages) {
        for (const m of messages) {
          state.sent.push({ connection: state.connects, id: m.publishingId });
          if (m.publishingId > state.lastId) state.lastId = m.publishingId;
          state.unconfirmed.push(m.publishingId);
        }
        return Promise.resolve();
      },
      queryLastId: () => {
        state.queries++;
        return Promise.resolve(state.lastId);
      },
      close: () => Promise.resolve(),
    };
    return {
      transport,
      state,
      confirmAll: () => {
        const ids = state.unconfirmed;
        state.unconfirmed = [];
        handlers?.confirmed(ids);
      },
      disconnect: () => {
        state.unconfirmed = [];
        handlers?.disconnected(new Error('connection lost'));
      },
      otherWrites: (id: bigint) => {
        if (id > state.lastId) state.lastId = id;
      },
    };
  }
  const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

  it('sends entry 3 before entry 2 is confirmed, and one last-ID query that finds 3 lands both (the old rule fenced 2)', async () => {
    const broker = heldTransport();
    const w = writer(broker.transport);
    const first = w.append(Buffer.from('e2'), 2n, () => true);
    const second = w.append(Buffer.from('e3'), 3n, () => true);
    await settle();
    expect(broker.state.sent.map((s) => s.id)).toEqual([2n, 3n]);
    broker.confirmAll();
    await expect(first).resolves.toBe('landed');
    await expect(second).resolves.toBe('landed');
    expect(broker.state.queries).toBe(1);
  });

  it('fences every entry from the first one another member wrote past, and lands the ones before it', async () => {
    const broker = heldTransport();
    const w = writer(broker.transport);
    const a = w.append(Buffer.from('e2'), 2n, () => true);
    await settle();
    broker.confirmAll();
    await expect(a).resolves.toBe('landed');
    // Another member writes ID 9 before our 5 and 7 arrive: the broker drops both (and confirms).
    broker.otherWrites(9n);
    const b = w.append(Buffer.from('e5'), 5n, () => true);
    const c = w.append(Buffer.from('e7'), 7n, () => true);
    await settle();
    broker.confirmAll();
    await expect(b).resolves.toBe('fenced');
    await expect(c).resolves.toBe('fenced');
  });

  it('sends every undecided entry again, in order, on the next connection after a loss', async () => {
    const broker = heldTransport();
    const w = writer(broker.transport);
    const appends = [2n, 3n, 4n].map((id) => w.append(Buffer.from(`e${id}`), id, () => true));
    await settle();
    broker.disconnect();
    await vi.waitFor(() => expect(broker.state.connects).toBe(2));
    await vi.waitFor(() => expect(broker.state.sent.filter((s) => s.connection === 2)).toHaveLength(3));
    expect(broker.state.sent.filter((s) => s.connection === 2).map((s) => s.id)).toEqual([2n, 3n, 4n]);
    broker.confirmAll();
    expect(await Promise.all(appends)).toEqual(['landed', 'landed', 'landed']);
  });

  it('gives up every entry after one whose period ended, and sends none of them again', async () => {
    const broker = heldTransport();
    const w = writer(broker.transport);
    let current = true;
    const appends = [2n, 3n].map((id) => w.append(Buffer.from(`e${id}`), id, () => current));
    await settle();
    current = false;
    broker.disconnect();
    const outcomes = await Promise.allSettled(appends);
    expect(outcomes.map((o) => o.status === 'rejected' && (o.reason as DedupError).code)).toEqual([
      'DEDUP_CONSUMER_CLOSED',
      'DEDUP_CONSUMER_CLOSED',
    ]);
    expect(broker.state.sent.map((s) => s.id)).toEqual([2n, 3n]);
  });
});

describe('changelog writer - a member paused while another took its partition over', () => {
  it('fences the entry it had in flight when the last ID on reconnecting is an entry it queued but never sent (the other member’s), instead of counting it as its own', async () => {
    // consumer-group-crash's pause test: entry 86 is on its way when the member stops; the other
    // member takes over and writes 91 (the same batch cut); after SIGCONT the member queues its
    // batch 91 before its writer reconnects. 91 is not ours: 86 and 91 are fenced, nothing lands.
    let handlers: TransportHandlers | undefined;
    let lastId = 0n;
    const sent: bigint[] = [];
    const transport: ChangelogTransport = {
      maxMessageBytes: 1 << 20,
      connect: (h) => {
        handlers = h;
        return Promise.resolve(lastId);
      },
      publish: (messages) => {
        for (const m of messages) {
          sent.push(m.publishingId);
          if (m.publishingId > lastId) lastId = m.publishingId;
        }
        return Promise.resolve();
      },
      queryLastId: () => Promise.resolve(lastId),
      close: () => Promise.resolve(),
    };
    const w = writer(transport);
    const inFlight = w.append(Buffer.from('e86'), 86n, () => true);
    await new Promise((resolve) => setImmediate(resolve));
    expect(sent).toEqual([86n]);
    // The pause: the connection dies, the other member writes 91.
    lastId = 91n;
    handlers?.disconnected(new Error('heartbeat timed out'));
    const next = w.append(Buffer.from('e91'), 91n, () => true);
    await expect(inFlight).resolves.toBe('fenced');
    await expect(next).resolves.toBe('fenced');
    expect(sent).toEqual([86n]);
  });
});

describe('changelog writer - a period that ended while its append waited', () => {
  it('gives up the old period’s append only, and lands the next period’s append queued after it', async () => {
    let handlers: TransportHandlers | undefined;
    let connects = 0;
    let lastId = 0n;
    const transport: ChangelogTransport = {
      maxMessageBytes: 1 << 20,
      connect: (h) => {
        handlers = h;
        // The first connection is lost before it confirms anything; later ones confirm.
        connects++;
        return Promise.resolve(lastId);
      },
      publish: (messages) => {
        for (const m of messages) if (m.publishingId > lastId) lastId = m.publishingId;
        if (connects > 1) queueMicrotask(() => handlers?.confirmed(messages.map((m) => m.publishingId)));
        return Promise.resolve();
      },
      queryLastId: () => Promise.resolve(lastId),
      close: () => Promise.resolve(),
    };
    const w = writer(transport);
    let oldPeriod = true;
    const old = w.append(Buffer.from('old'), 5n, () => oldPeriod);
    await new Promise((resolve) => setImmediate(resolve));
    // The partition moves and comes back: the old period ends, the new one restored up to 5 and
    // appends 7 while the old append still waits.
    oldPeriod = false;
    const next = w.append(Buffer.from('new'), 7n, () => true);
    handlers?.disconnected(new Error('lost'));
    await expect(old).rejects.toMatchObject({ code: 'DEDUP_CONSUMER_CLOSED' });
    await expect(next).resolves.toBe('landed');
  });
});
