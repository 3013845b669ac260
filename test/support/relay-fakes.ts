/**
 * Fakes for reviewing PgOutboxRelay without a server (revR): a pg pool whose clients answer the
 * relay's statements from an in-memory outbox, and a StreamTransport stand-in the test drives.
 * Only what the relay's life needs: one stream target, lease off.
 */
import { OUTBOX_COLUMNS, OUTBOX_KEYS } from '../../src/postgres/outbox-tables.js';
import type { OutgoingMessage } from '../../src/publisher/types.js';

export interface FakeRow {
  id: bigint;
  body: Buffer;
}

export interface FakeRecord {
  target: string;
  firstId: bigint;
  rowIds: bigint[];
  bodies: Buffer[];
}

/** The database: waiting rows, batch records, last_assigned, the lease epoch. */
export class FakeDb {
  outbox: FakeRow[] = [];
  records: FakeRecord[] = [];
  lastAssigned = new Map<string, bigint>();
  epoch = 0n;
  /** Batch records deleted (by a confirm's delete, a numbering's, or recovery's), in order. */
  deleted: FakeRecord[] = [];
  statements: string[] = [];
  /**
   * The advisory locks are this relay's for the asking (and a kept lock session still holds them);
   * false: another relay holds them, this one waits as a standby.
   */
  lockFree = true;
  /** Called before each statement; may throw or return a promise that never settles. */
  before: (text: string) => Promise<void> | void = () => undefined;
}

function result(rows: unknown[]): { rows: unknown[]; rowCount: number } {
  return { rows, rowCount: rows.length };
}

/** Deletes the records `gone` picks (moved to `db.deleted`); the rows they held. */
function deleteRecords(db: FakeDb, gone: (r: FakeRecord) => boolean): number {
  const picked = db.records.filter(gone);
  db.deleted.push(...picked);
  db.records = db.records.filter((r) => !gone(r));
  return picked.reduce((n, r) => n + r.rowIds.length, 0);
}

/** Answers one (possibly multi-statement) simple-query string. */
async function answer(db: FakeDb, text: string, values: readonly unknown[] = []): Promise<unknown> {
  db.statements.push(text);
  await db.before(text);
  const t = text.trim();
  // A numbering's (or a lone) delete of confirmed records: `USING unnest(ARRAY[…]::text[], '{…}'::bigint[])`.
  const inlined = /USING unnest\(ARRAY\[[^\]]*\]::text\[\], '\{([^}]*)\}'::bigint\[\]\)/.exec(t);
  if (inlined !== null && inlined[1] !== '') {
    const firsts = new Set(inlined[1]!.split(',').map((v) => BigInt(v)));
    deleteRecords(db, (r) => firsts.has(r.firstId));
  }
  if (/SELECT version FROM/.test(t)) return result([{ version: 1 }]);
  // The relay's shape check at open: the tables as migrate() creates them.
  if (/FROM pg_catalog\.pg_constraint/.test(t)) {
    return result(Object.entries(OUTBOX_KEYS).map(([table_name, columns]) => ({ table_name, columns })));
  }
  if (/FROM pg_catalog\.pg_attribute/.test(t)) {
    return result(
      Object.entries(OUTBOX_COLUMNS).flatMap(([table_name, columns]) =>
        Object.entries(columns).map(([column_name, udt_name]) => ({ table_name, column_name, udt_name })),
      ),
    );
  }
  if (/server_version_num/.test(t)) return result([{ v: 160000 }]);
  if (/pg_try_advisory_lock/.test(t)) return result([{ name: db.lockFree, outbox: db.lockFree }]);
  if (/count\(\*\)::int AS n FROM pg_locks/.test(t)) return result([{ n: db.lockFree ? 2 : 0 }]);
  if (/INSERT INTO .*outbox_relays/s.test(t)) {
    db.epoch += 1n;
    return result([{ epoch: db.epoch.toString(), partitions: null }]);
  }
  if (/sum\(cardinality\(row_ids\)\) AS rows/.test(t)) return result([]);
  if (/^SELECT epoch FROM/.test(t)) return result([{ epoch: db.epoch.toString() }]);
  if (/SELECT last_assigned FROM/.test(t)) {
    const v = db.lastAssigned.get('s');
    return result(v === undefined ? [] : [{ last_assigned: v.toString() }]);
  }
  if (/SELECT target, last_assigned FROM/.test(t)) {
    return result([...db.lastAssigned].map(([target, v]) => ({ target, last_assigned: v.toString() })));
  }
  if (/^WITH lease AS/.test(t)) {
    // #fencedDelete: first_id = ANY($3) (confirmed records) or records ending at or below $3 (stored).
    let deleted = 0;
    const bound = values[2];
    if (Array.isArray(bound)) {
      const firsts = new Set(bound.map((v) => BigInt(v as string)));
      deleted = deleteRecords(db, (r) => firsts.has(r.firstId));
    } else if (bound !== undefined) {
      const upTo = BigInt(bound as string);
      deleted = deleteRecords(db, (r) => r.firstId + BigInt(r.rowIds.length) - 1n <= upTo);
    }
    return result([{ epoch: db.epoch.toString(), deleted }]);
  }
  if (/SELECT first_id, row_ids/.test(t)) {
    // batchesAfter: first_id > $3 (recovery pages on).
    const after = BigInt((values[2] as string | number | bigint | undefined) ?? -1);
    return result(
      db.records
        .filter((r) => r.firstId > after)
        .map((r) => ({
          first_id: r.firstId.toString(),
          row_ids: r.rowIds.map(String),
          bodies: r.bodies,
          headers: r.bodies.map(() => null),
        })),
    );
  }
  if (/^BEGIN; SET LOCAL/.test(t)) {
    // The read: the first LIMIT waiting rows in id order.
    const limit = Number(/ORDER BY id LIMIT (\d+)/.exec(t)?.[1] ?? db.outbox.length);
    const read = [...db.outbox].sort((a, b) => (a.id < b.id ? -1 : 1)).slice(0, limit);
    const rows = read.map((r) => ({
      id: r.id.toString(),
      body: r.body,
      headers: null,
      message_key: null,
      routing_key: null,
      age_ms: 1,
      fetched: String(read.length),
    }));
    const empty = result([]);
    return [empty, empty, empty, empty, empty, result([{ epoch: db.epoch.toString() }]), result(rows)];
  }
  if (/INSERT INTO .*outbox_batches/s.test(t)) {
    // The move: the rows the statement names (`id = ANY('{…}'::bigint[])`, one per record, in
    // record order) into records from last_assigned + 1.
    const ids = [...t.matchAll(/WHERE id = ANY\('\{([^}]*)\}'::bigint\[\]\)/g)].flatMap((m) =>
      m[1]!.split(',').map((v) => BigInt(v)),
    );
    const moved = ids.map((id) => db.outbox.find((r) => r.id === id)!);
    const last = db.lastAssigned.get('s') ?? 0n;
    db.records.push({ target: 's', firstId: last + 1n, rowIds: ids, bodies: moved.map((r) => r.body) });
    db.lastAssigned.set('s', last + BigInt(ids.length));
    const gone = new Set(ids);
    db.outbox = db.outbox.filter((r) => !gone.has(r.id));
    return result([]);
  }
  return result([]);
}

export function fakePool(db: FakeDb): unknown {
  const client = {
    query(config: string | { text: string; values?: unknown[] }, values?: unknown[]): Promise<unknown> {
      return typeof config === 'string'
        ? answer(db, config, values)
        : answer(db, config.text, config.values ?? values);
    },
    escapeLiteral: (s: string) => `'${s.replace(/'/g, "''")}'`,
    release: () => undefined,
    on: () => client,
    removeListener: () => client,
  };
  // pg.Pool's two forms: the relay uses the callback (called once the client is handed over).
  return {
    connect: (callback?: (err: Error | undefined, c: typeof client) => void) => {
      if (callback === undefined) return Promise.resolve(client);
      queueMicrotask(() => callback(undefined, client));
      return undefined;
    },
  };
}

/** What the test makes of the broker. */
export interface FakeBroker {
  lastId: bigint;
  transports: FakeTransportLike[];
  /** Called for queryLastId: default answers `lastId`. */
  queryLastId: (t: FakeTransportLike) => Promise<bigint>;
  /** Confirms every published ID at once (setImmediate) when true. */
  autoConfirm: boolean;
  published: OutgoingMessage[];
  /** IDs published at or below the broker's last ID at their arrival: dropped (and confirmed). */
  dropped: bigint[];
  /** How long connect() takes (a leader election, a slow node), ms. */
  connectDelayMs: number;
  /**
   * publish() resolves a macrotask later (a socket waiting for 'drain'), not at once: confirms of
   * earlier records, and the checks they start, then land between the sends of one numbering.
   */
  publishYields: boolean;
  /** false: the broker takes the sends and stores nothing (a stream that lost its quorum). */
  stores: boolean;
}

export interface FakeTransportLike {
  handlers: { confirmed: (ids: readonly bigint[]) => void; disconnected: (e: Error) => void } | undefined;
  closed: boolean;
}

export const broker: FakeBroker = {
  lastId: 0n,
  transports: [],
  queryLastId: () => Promise.resolve(broker.lastId),
  autoConfirm: true,
  published: [],
  dropped: [],
  connectDelayMs: 0,
  publishYields: false,
  stores: true,
};

/** The broker as every test starts with it (each test file's afterEach). */
export function resetBroker(): void {
  broker.lastId = 0n;
  broker.transports = [];
  broker.published = [];
  broker.dropped = [];
  broker.autoConfirm = true;
  broker.connectDelayMs = 0;
  broker.publishYields = false;
  broker.stores = true;
  broker.queryLastId = () => Promise.resolve(broker.lastId);
}

/** The StreamTransport stand-in (vi.mock'ed in by the tests). */
export class FakeTransport implements FakeTransportLike {
  handlers: FakeTransportLike['handlers'];
  closed = false;
  readonly maxMessageBytes = 1_000_000;
  constructor() {
    broker.transports.push(this);
  }
  connect(handlers: NonNullable<FakeTransportLike['handlers']>): Promise<bigint> {
    this.handlers = handlers;
    return new Promise((resolve) => setTimeout(() => resolve(broker.lastId), broker.connectDelayMs));
  }
  publish(messages: readonly OutgoingMessage[]): Promise<void> {
    if (!broker.stores) return Promise.resolve();
    broker.published.push(...messages);
    for (const m of messages) {
      if (m.publishingId > broker.lastId) broker.lastId = m.publishingId;
      else broker.dropped.push(m.publishingId);
    }
    if (broker.autoConfirm) {
      const ids = messages.map((m) => m.publishingId);
      setImmediate(() => {
        if (!this.closed) this.handlers?.confirmed(ids);
      });
    }
    return broker.publishYields ? new Promise((resolve) => setImmediate(resolve)) : Promise.resolve();
  }
  queryLastId(): Promise<bigint> {
    return broker.queryLastId(this);
  }
  close(): Promise<void> {
    this.closed = true;
    return Promise.resolve();
  }
}
