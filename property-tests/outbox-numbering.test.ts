/**
 * A model of the outbox relay's numbering (docs/design.md §14, issue 35 item 3): application
 * transactions interleave INSERT, COMMIT and ROLLBACK (a bigserial id taken at INSERT, visible at
 * COMMIT; transactions on one key are serialised, as an application locking its aggregate row
 * does); the relay reads committed rows, numbers them, sends, handles confirms, and crashes at any
 * point (a crashed or paused life's frames still on the wire may arrive later, interleaved with the
 * next life's); the broker keeps the highest publishing ID and drops (while confirming) anything at
 * or below it. Property: the stream holds every committed row once, none of a rolled-back or
 * unfinished transaction, and per key in commit order.
 *
 * The relay's write path, step by step: a numbering transaction reads waiting rows and, at its
 * COMMIT, moves them into a batch record (first ID + row ids) — a crash in between leaves them
 * waiting; the record's rows are sent only after that COMMIT; confirms reach the relay; a flush
 * deletes the records every ID of which was confirmed; a new life deletes the records wholly at or
 * below the broker's last ID and re-sends the other rows above it, in ID order. It passes. Each
 * reverted step (see `Scheme`) fails, and must keep failing: the model has to be able to see the
 * hazard each step guards against.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

type Cmd =
  | { readonly t: 'begin'; readonly key: number }
  | { readonly t: 'insert'; readonly tx: number }
  | { readonly t: 'commit'; readonly tx: number }
  | { readonly t: 'rollback'; readonly tx: number }
  | { readonly t: 'read'; readonly n: number }
  | { readonly t: 'commitNumbering' }
  | { readonly t: 'send'; readonly n: number }
  | { readonly t: 'deliver'; readonly wire: number }
  | { readonly t: 'ack' }
  | { readonly t: 'flush' }
  | { readonly t: 'crash'; readonly flush: boolean };

/**
 * `relay`: the write path as built. The others each revert one step and must fail:
 * `naive` publishes the bigserial id; `sendBeforeCommit` sends a read's rows before its batch
 * record commits; `idOrder` numbers a read's rows from the lowest id waiting anywhere (as if
 * ordered by id across reads: a row committed late takes an ID below one already sent);
 * `deleteStraddling` deletes at recovery every record starting at or below the broker's last ID,
 * rather than only those ending there.
 */
type Scheme = 'relay' | 'naive' | 'sendBeforeCommit' | 'idOrder' | 'deleteStraddling';

interface Row {
  readonly id: number;
  readonly key: number;
  readonly tx: number;
  /** Moved into a batch record (numbered) or, naive, deleted after its confirm. */
  gone: boolean;
}

interface Tx {
  readonly key: number;
  state: 'open' | 'committed' | 'rolledBack';
  commitSeq: number;
}

interface Message {
  readonly pid: number;
  readonly rowId: number;
}

/** A batch record: IDs first … first + rows.length - 1, durable from its commit to its delete. */
interface Batch {
  readonly first: number;
  readonly rows: readonly number[];
}

class World {
  readonly rows = new Map<number, Row>();
  readonly txs: Tx[] = [];
  #serial = 0;
  #commits = 0;
  /** Durable: the highest publishing ID numbered, and the batch records. */
  lastAssigned = 0;
  batches: Batch[] = [];
  /** Volatile, per life: a read not yet committed; what is to be sent; confirms per record. */
  tentative: Batch | undefined;
  pending: Message[] = [];
  confirmedIds = new Set<number>();
  /** Naive: rows this life took. */
  taken = new Set<number>();
  /** Broker. */
  brokerLast = 0;
  readonly stream: number[] = [];
  /** Each life's connection: frames in order; old lives' frames stay deliverable. */
  readonly wires: Message[][] = [[]];
  readonly confirms: number[] = [];
  readonly log: string[] = [];
  /** A life refused to open (the broker's last ID above every ID numbered): rows stuck. */
  refused: string | undefined;

  constructor(readonly scheme: Scheme) {
    this.recover();
  }

  get wire(): Message[] {
    return this.wires[this.wires.length - 1]!;
  }

  openTxs(): number[] {
    return this.txs.flatMap((t, i) => (t.state === 'open' ? [i] : []));
  }

  apply(cmd: Cmd): void {
    if (this.refused !== undefined) return;
    const open = this.openTxs();
    switch (cmd.t) {
      case 'begin': {
        // One open transaction per key: the application serialises a key's transactions.
        if (this.txs.some((t) => t.state === 'open' && t.key === cmd.key)) return;
        this.txs.push({ key: cmd.key, state: 'open', commitSeq: 0 });
        this.#insert(this.txs.length - 1);
        return;
      }
      case 'insert':
        if (open.length > 0) this.#insert(open[cmd.tx % open.length]!);
        return;
      case 'commit':
      case 'rollback': {
        if (open.length === 0) return;
        const i = open[cmd.tx % open.length]!;
        const tx = this.txs[i]!;
        tx.state = cmd.t === 'commit' ? 'committed' : 'rolledBack';
        tx.commitSeq = ++this.#commits;
        this.log.push(`${cmd.t} tx${i}`);
        // A rolled-back transaction's rows never existed for anyone else.
        if (cmd.t === 'rollback') for (const r of this.rows.values()) if (r.tx === i) this.rows.delete(r.id);
        return;
      }
      case 'read':
        this.read(cmd.n + 1);
        return;
      case 'commitNumbering':
        this.commitNumbering();
        return;
      case 'send':
        for (let k = 0; k <= cmd.n && this.pending.length > 0; k++) this.wire.push(this.pending.shift()!);
        return;
      case 'deliver': {
        const wires = this.wires.filter((w) => w.length > 0);
        if (wires.length > 0) this.#deliver(wires[cmd.wire % wires.length]!);
        return;
      }
      case 'ack':
        this.ack();
        return;
      case 'flush':
        this.flush();
        return;
      case 'crash':
        // flush: the life was paused, not killed, and its unsent messages leave later on its wire.
        if (cmd.flush) this.wire.push(...this.pending);
        this.log.push(`crash${cmd.flush ? ' (paused, flushed)' : ''}`);
        this.pending = [];
        this.tentative = undefined;
        this.confirmedIds = new Set();
        this.taken = new Set();
        this.wires.push([]);
        this.recover();
        return;
    }
  }

  #insert(tx: number): void {
    const id = ++this.#serial;
    this.rows.set(id, { id, key: this.txs[tx]!.key, tx, gone: false });
    this.log.push(`insert id${id} tx${tx} key${this.txs[tx]!.key}`);
  }

  /** Rows in the outbox table a read sees: committed, not moved out, in id order. */
  #visible(): Row[] {
    return [...this.rows.values()]
      .filter((r) => !r.gone && this.txs[r.tx]!.state === 'committed')
      .sort((a, b) => a.id - b.id);
  }

  /**
   * The numbering transaction's read (under the lease lock, after the last numbering committed):
   * up to `limit` waiting rows in id order, numbered from `lastAssigned + 1`; nothing durable yet.
   */
  read(limit: number): void {
    if (this.scheme === 'naive') {
      for (const r of this.#visible()) {
        if (this.taken.has(r.id)) continue;
        this.taken.add(r.id);
        this.pending.push({ pid: r.id, rowId: r.id });
      }
      this.log.push('naive relay reads');
      return;
    }
    if (this.tentative !== undefined) return; // one numbering transaction at a time
    const rows = this.#visible()
      .slice(0, limit)
      .map((r) => r.id);
    if (rows.length === 0) return;
    // idOrder: the first ID is the row's rank among every row ever read, as if IDs followed ids.
    const first =
      this.scheme === 'idOrder'
        ? [...this.rows.values()].filter((r) => r.gone && r.id < rows[0]!).length + 1
        : this.lastAssigned + 1;
    this.tentative = { first, rows };
    this.log.push(`relay reads ${rows.map((id) => `id${id}`).join(',')} as ${first}…`);
    if (this.scheme === 'sendBeforeCommit') this.#queue(this.tentative, 0);
  }

  /** The numbering's COMMIT: rows leave the outbox, the batch record and `lastAssigned` are durable. */
  commitNumbering(): void {
    const b = this.tentative;
    if (b === undefined) return;
    this.tentative = undefined;
    for (const id of b.rows) this.rows.get(id)!.gone = true;
    this.batches.push(b);
    this.lastAssigned = Math.max(this.lastAssigned, b.first + b.rows.length - 1);
    this.log.push(`numbering commits ${b.first}…${b.first + b.rows.length - 1}`);
    if (this.scheme !== 'sendBeforeCommit') this.#queue(b, 0);
  }

  #queue(b: Batch, above: number): void {
    b.rows.forEach((rowId, i) => {
      if (b.first + i > above) this.pending.push({ pid: b.first + i, rowId });
    });
  }

  /** A new life: asks the broker its last ID L; records at or below it are stored, the rest re-sent. */
  recover(): void {
    const last = this.brokerLast;
    if (this.scheme === 'naive') {
      for (const r of this.#visible()) if (r.id <= last) r.gone = true;
      this.read(Infinity);
      return;
    }
    if (last > this.lastAssigned) {
      this.refused = `the broker's last ID ${last} is above the ${this.lastAssigned} numbered: the relay refuses to open`;
      return;
    }
    const end = (b: Batch): number => b.first + b.rows.length - 1;
    const stored = (b: Batch): boolean =>
      this.scheme === 'deleteStraddling' ? b.first <= last : end(b) <= last;
    this.batches = this.batches.filter((b) => !stored(b));
    for (const b of [...this.batches].sort((x, y) => x.first - y.first)) this.#queue(b, last);
  }

  #deliver(wire: Message[]): void {
    const m = wire.shift()!;
    if (m.pid > this.brokerLast) {
      this.brokerLast = m.pid;
      this.stream.push(m.rowId);
      this.log.push(`broker stores id${m.rowId} as ${m.pid}`);
    } else {
      this.log.push(`broker drops id${m.rowId} as ${m.pid} (last ${this.brokerLast})`);
    }
    this.confirms.push(m.pid);
  }

  /** Confirms reach the relay (volatile). Naive: the row is deleted. */
  ack(): void {
    for (const pid of this.confirms.splice(0)) {
      if (this.scheme === 'naive') {
        const r = this.rows.get(pid);
        if (r !== undefined) r.gone = true;
      } else this.confirmedIds.add(pid);
    }
  }

  /** Deletes the records every ID of which this life heard confirmed. */
  flush(): void {
    this.batches = this.batches.filter((b) => !b.rows.every((_, i) => this.confirmedIds.has(b.first + i)));
  }

  /** Runs the relay and the broker until nothing moves. */
  drain(): void {
    for (let round = 0; round < 100 && this.refused === undefined; round++) {
      this.commitNumbering();
      for (;;) {
        this.read(Infinity);
        if (this.tentative === undefined) break;
        this.commitNumbering();
      }
      this.wire.push(...this.pending.splice(0));
      for (const w of this.wires) while (w.length > 0) this.#deliver(w);
      this.ack();
      this.flush();
      if (this.#visible().length === 0 && this.batches.length === 0) return;
      // A relay restarted on what is left (records found stored, or lost).
      this.apply({ t: 'crash', flush: false });
    }
  }

  /** What is wrong with the stream, or undefined. */
  violation(): string | undefined {
    if (this.refused !== undefined) return this.refused;
    const seen = new Map<number, number>();
    for (const id of this.stream) seen.set(id, (seen.get(id) ?? 0) + 1);
    const committed = [...new Set([...this.txs.keys()].filter((i) => this.txs[i]!.state === 'committed'))];
    const expected: Row[] = [];
    for (let id = 1; id <= this.#serial; id++) {
      const r = this.rows.get(id);
      if (r !== undefined && committed.includes(r.tx)) expected.push(r);
    }
    for (const r of expected) {
      const n = seen.get(r.id) ?? 0;
      if (n !== 1) return `committed row id${r.id} is in the stream ${n} times`;
    }
    for (const id of seen.keys()) {
      if (!expected.some((r) => r.id === id))
        return `row id${id} of an unfinished or rolled-back transaction was published`;
    }
    for (const key of new Set(expected.map((r) => r.key))) {
      const want = expected
        .filter((r) => r.key === key)
        .sort((a, b) => this.txs[a.tx]!.commitSeq - this.txs[b.tx]!.commitSeq || a.id - b.id)
        .map((r) => r.id);
      const got = this.stream.filter((id) => want.includes(id));
      if (got.join() !== want.join())
        return `key ${key}: stream order ${got.join()} is not commit order ${want.join()}`;
    }
    return undefined;
  }
}

const command: fc.Arbitrary<Cmd> = fc.oneof(
  { weight: 3, arbitrary: fc.integer({ min: 0, max: 2 }).map((key) => ({ t: 'begin' as const, key })) },
  { weight: 1, arbitrary: fc.nat(7).map((tx) => ({ t: 'insert' as const, tx })) },
  { weight: 3, arbitrary: fc.nat(7).map((tx) => ({ t: 'commit' as const, tx })) },
  { weight: 1, arbitrary: fc.nat(7).map((tx) => ({ t: 'rollback' as const, tx })) },
  { weight: 2, arbitrary: fc.nat(3).map((n) => ({ t: 'read' as const, n })) },
  { weight: 2, arbitrary: fc.constant({ t: 'commitNumbering' as const }) },
  { weight: 2, arbitrary: fc.nat(3).map((n) => ({ t: 'send' as const, n })) },
  { weight: 3, arbitrary: fc.nat(3).map((wire) => ({ t: 'deliver' as const, wire })) },
  { weight: 2, arbitrary: fc.constant({ t: 'ack' as const }) },
  { weight: 2, arbitrary: fc.constant({ t: 'flush' as const }) },
  { weight: 1, arbitrary: fc.boolean().map((flush) => ({ t: 'crash' as const, flush })) },
);

function run(scheme: Scheme, cmds: readonly Cmd[]): World {
  const world = new World(scheme);
  for (const cmd of cmds) world.apply(cmd);
  world.drain();
  return world;
}

const property = (scheme: Scheme) =>
  fc.property(fc.array(command, { maxLength: 60, size: 'medium' }), (cmds) => {
    const world = run(scheme, cmds);
    const problem = world.violation();
    if (problem !== undefined) throw new Error(`${problem}\n  ${world.log.join('\n  ')}`);
  });

/** A reverted step must fail: the model has to be able to see the hazard the step guards against. */
function mustFail(scheme: Scheme, expected: RegExp, numRuns = 3_000): void {
  const result = fc.check(property(scheme), { numRuns });
  expect(result.failed).toBe(true);
  if (process.env.OUTBOX_MODEL_PRINT === '1')
    console.log(
      scheme,
      result.counterexample,
      String(result.errorInstance),
      result.numRuns,
      result.numShrinks,
    );
  // The shrunk counterexamples are recorded in docs/design.md §14.
  expect(String(result.errorInstance)).toMatch(expected);
}

describe('outbox numbering model', () => {
  it('relay numbering: every committed row once, in commit order per key, none rolled back, whatever crashes', () => {
    fc.assert(property('relay'), { numRuns: 3_000 });
  });

  it('naive numbering (the bigserial id as publishing ID) loses a row: the model sees the hazard', () => {
    mustFail('naive', /in the stream 0 times/);
  });

  it('sending a read before its batch record commits: the next life cannot go on (or loses rows)', () => {
    mustFail('sendBeforeCommit', /refuses to open|in the stream 0 times/);
  });

  it('numbering in id order across reads (a late commit below an ID sent) loses a row', () => {
    mustFail('idOrder', /in the stream 0 times|in the stream 2 times/);
  });

  it('deleting at recovery a record that only starts at or below the broker last ID loses its tail', () => {
    // Rarer than the others (307 runs at the seed design §14 quotes; a clean-clone CI run's seed
    // missed it in 3 000; 30 seeds here: 7–1 907 runs): 30 000 runs, stopping at the first failure.
    mustFail('deleteStraddling', /in the stream 0 times/, 30_000);
  });
});
