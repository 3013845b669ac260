/**
 * The consumer group's hand-over model (group-handover.test.ts, docs/design.md §12) with changelog
 * snapshots (§12.1): members write snapshots of their state into the changelog between batches —
 * part after part, each a scheduled step, so that a crash or a zombie tears them or mixes two
 * writers' parts — with the real encoding, IDs and assembler (src/group/snapshot-*.ts). A member
 * whose store was lost, and the final member (a new one, empty store), restore from the latest
 * snapshot reference and the entries after it; a snapshot that cannot be used falls back to the
 * whole changelog. The members split their snapshots differently (parts of 1 to 3 keys), as
 * members with other settings or a changed state would.
 *
 * The property: every interleaving of hand-overs, zombies, crashes and lost stores ends with the
 * exact fold. Without the marker's completeness check (count and digest) fast-check finds a
 * restore of a mixed snapshot whose fold is wrong.
 *
 * Retention (§12.2): before the final take-over the changelog's head is trimmed at a drawn point;
 * the take-over either restores the exact fold from a complete snapshot after it or refuses (its
 * referenced snapshot, or the head a whole-changelog read needs, is gone). With the refusal
 * removed the hole check stops the partial read (found after 3-10 runs as a hole); with the hole
 * check removed too, the model finds a wrong fold at once (1 run, shrunk 22 times).
 *
 * The restore's reach (hostile review revS, F1): a snapshot restore must reach the changelog's last
 * entry as it was when the restore began (the real restore reads until the entry producer's last
 * ID); every member may die for good right after a reference is stored (before the batch it
 * preceded); zombies are up to 60 steps late. A zombie's complete snapshot of an older state can
 * then land between the reference and the snapshot it was stored for: the restore reads every
 * snapshot message up to the snapshot producer's last ID at its start and applies the newest
 * complete one. With the first complete one taken instead (the rule before the fix), fast-check
 * finds a restore that ends below the changelog's last entry (seed 2: 4 177 runs, shrunk 33).
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { Op } from '../src/consumer/commit-pipeline.js';
import { SnapshotAssembler, SnapshotUnusable } from '../src/group/snapshot-assembler.js';
import {
  decodeSnapshotRecord,
  encodeMarker,
  encodePart,
  partBody,
  snapshotDigest,
  snapshotId,
  type SnapshotRecord,
} from '../src/group/snapshot-entry.js';

interface Input {
  readonly id: number;
  readonly amount: number;
}

type Message =
  | {
      readonly kind: 'entry';
      readonly base: number;
      readonly last: number;
      readonly values: ReadonlyMap<string, number>;
    }
  | { readonly kind: 'snapshot'; readonly id: bigint; readonly raw: Buffer };

interface Member {
  offset: number;
  kv: Map<string, number>;
  epoch: number;
  /** Keys per snapshot part. */
  readonly split: number;
  /** Entries between snapshots. */
  readonly every: number;
  /** Entries appended since the last snapshot (in memory: a crash resets it). */
  since: number;
}

interface World {
  readonly input: readonly Input[];
  readonly log: Message[];
  lastId: number;
  snapshotLastId: bigint;
  /** The broker's offset tracking: where the latest snapshot's reference points (not fenced). */
  reference: number | undefined;
  readonly members: Member[];
  doubles: number;
  holes: number;
  snapshotRestores: number;
  /** The first log index retention kept (§12.2): messages before it are gone. */
  first: number;
  /** Whether a restore refuses a history whose snapshot or head was trimmed (false: the revert). */
  readonly refuseTrimmed: boolean;
  /** Restores refused so (DEDUP_CHANGELOG_INVALID in the real restore). */
  refused: number;
  /** Whether a snapshot restore takes the newest complete snapshot (false: the first, the revert). */
  readonly newest: boolean;
  /** Snapshot restores that ended below the changelog's last entry at their start (F1). */
  stuck: number;
  /** References stored until every member dies for good (Infinity: never); what dying does. */
  refsToCut: number;
  die: () => void;
}

type Assembler = Pick<SnapshotAssembler, 'take' | 'entry'>;

/** The assembler without its completeness check: a candidate is taken at its marker, whatever it holds. */
class UncheckedAssembler implements Assembler {
  #candidate: { offset: bigint; ops: Op[] } | undefined;
  #done = false;
  entry(): void {}
  take(record: SnapshotRecord): { readonly offset: bigint; readonly ops: readonly Op[] } | undefined {
    if (this.#done) return undefined;
    if (record.kind === 'part') {
      if (record.index === 0 && (this.#candidate === undefined || record.offset > this.#candidate.offset))
        this.#candidate = { offset: record.offset, ops: [...record.ops] };
      else if (this.#candidate?.offset === record.offset && record.index > 0)
        this.#candidate.ops.push(...record.ops);
      return undefined;
    }
    if (this.#candidate?.offset !== record.offset) return undefined;
    this.#done = true;
    return this.#candidate;
  }
}

const value = (n: number): Uint8Array => Buffer.from(String(n));
const number = (v: Uint8Array): number => Number(Buffer.from(v).toString());

function applyMessage(kv: Map<string, number>, world: World, message: Input): void {
  if (message.id <= (kv.get('tracker') ?? 0)) return;
  kv.set('tracker', message.id);
  if (kv.get(`applied:${message.id}`) === 1) world.doubles++;
  kv.set(`applied:${message.id}`, 1);
  kv.set('balance', (kv.get('balance') ?? 0) + message.amount);
  kv.set('count', (kv.get('count') ?? 0) + 1);
}

/** Applies changelog messages from `from` on, as the real restore does: skips, holes. */
async function readEntries(
  s: fc.Scheduler,
  world: World,
  m: Member,
  epoch: number,
  from: number,
  snapshot: { assembler: Assembler } | undefined,
): Promise<'done' | 'moved' | 'unusable'> {
  let complete = snapshot === undefined;
  // The snapshot producer's last ID at the start: every snapshot message up to it is read (newest).
  const snapshotsUpTo = world.snapshotLastId;
  let snapshotsOpen = snapshot !== undefined && world.newest;
  let applied = false;
  for (let i = from; i < world.log.length; i++) {
    await s.schedule(Promise.resolve(), `read message ${i}`);
    if (m.epoch !== epoch) return 'moved';
    const message = world.log[i]!;
    if (message.kind === 'snapshot' && snapshotsOpen) {
      if (message.id >= snapshotsUpTo) snapshotsOpen = false;
      const record = decodeSnapshotRecord(message.raw, () => true, `at ${i}`);
      let taken;
      try {
        taken = snapshot!.assembler.take(record);
      } catch (err) {
        if (err instanceof SnapshotUnusable) return 'unusable';
        throw err;
      }
      if (taken !== undefined && (!applied || Number(taken.offset) > m.offset)) {
        applied = true;
        m.kv = new Map();
        for (const op of taken.ops)
          if (op.type === 'put' && op.key !== 'offset') m.kv.set(op.key, number(op.value));
        const offset = taken.ops.find((op) => op.key === 'offset');
        m.offset =
          offset !== undefined && offset.type === 'put' ? number(offset.value) : Number(taken.offset);
      }
      if (!snapshotsOpen) {
        if (!applied) return 'unusable';
        complete = true;
        world.snapshotRestores++;
      }
      continue;
    }
    if (message.kind === 'entry' && snapshot !== undefined && world.newest && !complete && applied) {
      // Entries after an applied snapshot while newer ones may still come: applied (not persisted).
      if (message.last <= m.offset) continue;
      if (message.base > m.offset) return 'unusable';
      for (const [k, v] of message.values) if (k !== 'offset') m.kv.set(k, v);
      m.offset = message.last;
      continue;
    }
    if (message.kind === 'snapshot') {
      if (complete) continue;
      const record = decodeSnapshotRecord(message.raw, () => true, `at ${i}`);
      let taken;
      try {
        taken = snapshot!.assembler.take(record);
      } catch (err) {
        if (err instanceof SnapshotUnusable) return 'unusable';
        throw err;
      }
      if (taken === undefined) continue;
      complete = true;
      m.kv = new Map();
      for (const op of taken.ops)
        if (op.type === 'put' && op.key !== 'offset') m.kv.set(op.key, number(op.value));
      const offset = taken.ops.find((op) => op.key === 'offset');
      m.offset = offset !== undefined && offset.type === 'put' ? number(offset.value) : Number(taken.offset);
      world.snapshotRestores++;
      continue;
    }
    if (!complete) {
      snapshot!.assembler.entry(BigInt(message.last));
      continue;
    }
    if (message.last <= m.offset) continue;
    if (message.base > m.offset) {
      if (snapshot !== undefined) return 'unusable';
      world.holes++;
      return 'moved';
    }
    for (const [k, v] of message.values) if (k !== 'offset') m.kv.set(k, v);
    m.offset = message.last;
  }
  return complete ? 'done' : 'unusable';
}

async function restore(
  s: fc.Scheduler,
  world: World,
  m: Member,
  epoch: number,
  checked: boolean,
): Promise<boolean> {
  if (m.offset === -1 && world.reference !== undefined) {
    // The referenced snapshot was trimmed away: refused, never guessed.
    if (world.reference < world.first && world.refuseTrimmed) {
      world.refused++;
      return false;
    }
    const assembler = checked ? new SnapshotAssembler() : new UncheckedAssembler();
    const from = Math.max(world.reference, world.first);
    // The real restore's target: the entry producer's last ID when it begins.
    const target = world.lastId - 2;
    const outcome = await readEntries(s, world, m, epoch, from, { assembler });
    if (outcome === 'done' && m.epoch === epoch && m.offset < target) {
      // The real restore waits for entries behind its position until restoreTimeoutMs (F1).
      world.stuck++;
      return false;
    }
    if (outcome === 'done') return true;
    if (outcome === 'moved') return false;
    // Not usable: the whole changelog (from the state the snapshot left, if it was applied).
  }
  // The whole changelog, whose head retention removed: refused.
  if (world.first > 0 && world.refuseTrimmed) {
    world.refused++;
    return false;
  }
  return (await readEntries(s, world, m, epoch, world.first, undefined)) === 'done';
}

/** Writes a snapshot of `m`'s state, a scheduled step per message, as snapshot-writer.ts does. */
async function writeSnapshot(
  s: fc.Scheduler,
  world: World,
  m: Member,
  epoch: number,
  name: string,
): Promise<void> {
  const offset = m.offset;
  const state = new Map(m.kv);
  await s.schedule(Promise.resolve(), `${name} asks the last snapshot ID`);
  if (m.epoch !== epoch) return;
  if (world.snapshotLastId >= snapshotId(BigInt(offset), 0)!) return;
  const from = world.log.length;
  const ops: Op[] = [
    { type: 'put', key: 'offset', value: value(offset) },
    ...[...state]
      .sort(([a], [b]) => (a < b ? -1 : 1))
      .map(([key, v]) => ({ type: 'put' as const, key, value: value(v) })),
  ];
  const digest = snapshotDigest();
  const append = async (raw: Buffer, index: number, what: string): Promise<boolean> => {
    const id = snapshotId(BigInt(offset), index)!;
    await s.schedule(Promise.resolve(), `${name} appends snapshot ${offset} ${what}`);
    if (m.epoch !== epoch) return false;
    if (id > world.snapshotLastId) {
      world.log.push({ kind: 'snapshot', id, raw });
      world.snapshotLastId = id;
    }
    await s.schedule(Promise.resolve(), `${name} confirm of snapshot ${offset} ${what}`);
    return m.epoch === epoch && world.snapshotLastId === id;
  };
  let parts = 0;
  for (let i = 0; i < ops.length; i += m.split) {
    const raw = encodePart(BigInt(offset), parts, ops.slice(i, i + m.split));
    digest.update(partBody(raw));
    if (!(await append(raw, parts, `part ${parts}`))) return;
    parts++;
  }
  // The store moved while it was read (another activation's restore): no marker.
  if (m.offset !== offset) return;
  if (!(await append(encodeMarker(BigInt(offset), parts, ops.length, digest.digest()), parts, 'marker')))
    return;
  await s.schedule(Promise.resolve(), `${name} asks the last entry ID`);
  if (m.epoch !== epoch || world.lastId !== offset + 2) return;
  await s.schedule(Promise.resolve(), `${name} stores the reference ${from}`);
  if (m.epoch !== epoch) return;
  world.reference = from;
  // Every member may die right after a reference is stored (before the batch it preceded).
  if (--world.refsToCut === 0) world.die();
}

async function hold(
  s: fc.Scheduler,
  world: World,
  m: Member,
  batchSize: number,
  name: string,
  checked: boolean,
): Promise<void> {
  const epoch = m.epoch;
  if (!(await restore(s, world, m, epoch, checked))) return;
  let from = m.offset + 1;
  while (from <= world.input.length - 1) {
    const working = new Map(m.kv);
    const base = m.offset;
    const last = Math.min(world.input.length - 1, from + batchSize - 1);
    const written = new Map<string, number>();
    for (let o = from; o <= last; o++) {
      const before = new Map(working);
      applyMessage(working, world, world.input[o]!);
      for (const [k, v] of working) if (before.get(k) !== v) written.set(k, v);
    }
    written.set('offset', last);
    if (m.since >= m.every && m.offset >= 0) {
      await writeSnapshot(s, world, m, epoch, name);
      if (m.epoch !== epoch) return;
      m.since = 0;
    }
    await s.schedule(Promise.resolve(), `${name} appends ${from}..${last}`);
    if (m.epoch !== epoch) return;
    const id = last + 2;
    if (id > world.lastId) {
      world.log.push({ kind: 'entry', base, last, values: written });
      world.lastId = id;
    }
    await s.schedule(Promise.resolve(), `${name} confirm of ${id}`);
    if (m.epoch !== epoch) return;
    if (world.lastId > id) return; // fenced
    await s.schedule(Promise.resolve(), `${name} commits ${from}..${last} locally`);
    if (m.epoch !== epoch) return;
    for (const [k, v] of written) if (k !== 'offset') m.kv.set(k, v);
    m.offset = last;
    m.since++;
    from = last + 1;
  }
}

const inputArb = fc
  .array(fc.record({ amount: fc.integer({ min: 1, max: 9 }), repeat: fc.boolean() }), {
    minLength: 6,
    maxLength: 20,
  })
  .map((raw) => {
    const input: Input[] = [];
    let next = 1;
    for (const r of raw) {
      if (r.repeat && input.length > 0) input.push(input[input.length - 1]!);
      else input.push({ id: next++, amount: r.amount });
    }
    return input;
  });

/** A hand-over's old holder hears of it after `late` more scheduled steps: a zombie that long. */
type Event = { kind: 'handover'; late: number } | { kind: 'crash' | 'store lost' };
const eventsOf = (late: number) =>
  fc.array(
    fc.oneof(
      fc.record({ kind: fc.constant('handover' as const), late: fc.integer({ min: 0, max: late }) }),
      fc.record({ kind: fc.constantFrom('crash' as const, 'store lost' as const) }),
    ),
    { minLength: 1, maxLength: 4 },
  );
const eventsArb = eventsOf(12);
const memberArb = fc.record({
  batch: fc.integer({ min: 1, max: 3 }),
  split: fc.integer({ min: 1, max: 3 }),
  every: fc.integer({ min: 1, max: 2 }),
});

async function runModel(
  s: fc.Scheduler,
  input: readonly Input[],
  events: readonly Event[],
  specs: ReadonlyArray<{ batch: number; split: number; every: number }>,
  checked: boolean,
  trim: { readonly percent: number; readonly refuse: boolean } = { percent: 0, refuse: true },
  reach: { readonly cut: number; readonly newest: boolean } = { cut: Infinity, newest: true },
): Promise<{ world: World; final: Member }> {
  let dead = false;
  const newMember = (i: number): Member => ({
    offset: -1,
    kv: new Map(),
    epoch: 0,
    split: specs[i]!.split,
    every: specs[i]!.every,
    since: 0,
  });
  const world: World = {
    input,
    log: [],
    lastId: 0,
    snapshotLastId: 0n,
    reference: undefined,
    members: [newMember(0), newMember(1)],
    doubles: 0,
    holes: 0,
    snapshotRestores: 0,
    first: 0,
    refuseTrimmed: trim.refuse,
    refused: 0,
    newest: reach.newest,
    stuck: 0,
    refsToCut: reach.cut,
    die: () => {
      dead = true;
      for (const m of world.members) m.epoch++;
    },
  };
  let holder = 0;
  const runs: Promise<void>[] = [];
  const start = (i: number): void => {
    // After the cut every member is dead for good: the final member takes over what the log holds.
    if (dead) return;
    world.members[i]!.epoch++;
    runs.push(hold(s, world, world.members[i]!, specs[i]!.batch, `m${i}`, checked));
  };
  start(holder);
  for (const [n, event] of events.entries()) {
    runs.push(
      s.schedule(Promise.resolve(), `event ${n}: ${event.kind}`).then(async () => {
        const old = holder;
        if (event.kind !== 'handover') {
          world.members[old]!.since = 0;
          if (event.kind === 'store lost') {
            const m = world.members[old]!;
            m.offset = -1;
            m.kv = new Map();
          }
          start(old);
          return;
        }
        holder = 1 - old;
        start(holder);
        for (let i = 0; i < event.late; i++) await s.schedule(Promise.resolve(), `m${old} still a zombie`);
        await s.schedule(Promise.resolve(), `m${old} hears it lost the partition`);
        world.members[old]!.epoch++;
      }),
    );
  }
  // Every period to its end, including those that events started meanwhile (a Promise.all over
  // the array as it was would let the final epoch bump below cut them short).
  for (let n = 0; n < runs.length;) {
    n = runs.length;
    await s.waitFor(Promise.all(runs));
  }
  await s.waitAll();
  // A new member with an empty store takes the partition over, alone, to the end of the input.
  for (const m of world.members) m.epoch++;
  // Retention trims the changelog's head before the final take-over (whole segments: any index).
  world.first = Math.floor((trim.percent * world.log.length) / 100);
  const final: Member = { offset: -1, kv: new Map(), epoch: 1, split: 1, every: 1_000, since: 0 };
  await s.waitFor(hold(s, world, final, input.length, 'final', checked));
  return { world, final };
}

function exactFold(world: World, final: Member): boolean {
  const seen = new Set<number>();
  let balance = 0;
  for (const m of world.input) {
    if (seen.has(m.id)) continue;
    seen.add(m.id);
    balance += m.amount;
  }
  const marks = [...final.kv.keys()].filter((k) => k.startsWith('applied:')).sort();
  return (
    world.doubles === 0 &&
    world.holes === 0 &&
    world.stuck === 0 &&
    final.offset === world.input.length - 1 &&
    final.kv.get('balance') === balance &&
    final.kv.get('count') === seen.size &&
    JSON.stringify(marks) === JSON.stringify([...seen].map((id) => `applied:${id}`).sort())
  );
}

/**
 * Members that snapshot after every entry and split differently (1 and 3 keys a part): where two
 * writers' parts of one state mix. The search without the check is focused there (found in 3 113
 * of 20 000 runs over all members, too rare for a test that must fail every time).
 */
const mixingMembersArb = fc.tuple(
  fc.record({ batch: fc.integer({ min: 1, max: 3 }), split: fc.constant(1), every: fc.constant(1) }),
  fc.record({ batch: fc.integer({ min: 1, max: 3 }), split: fc.constant(3), every: fc.constant(1) }),
);

function property(checked: boolean, stats?: { snapshotRestores: number }, mixing = false) {
  return fc.asyncProperty(
    fc.scheduler(),
    inputArb,
    eventsArb,
    mixing ? mixingMembersArb : fc.tuple(memberArb, memberArb),
    async (s, input, events, specs) => {
      const { world, final } = await runModel(s, input, events, specs, checked);
      if (stats !== undefined) stats.snapshotRestores += world.snapshotRestores;
      return exactFold(world, final);
    },
  );
}

/** Trimming counts over a run of {@link trimProperty}. */
interface TrimStats {
  trimmed: number;
  refused: number;
  restoredAfterTrim: number;
}

/**
 * The final take-over after retention trimmed the changelog's head at a drawn point (§12.2): it
 * restores the exact fold from a complete snapshot after the trim point, or refuses.
 */
function trimProperty(refuse: boolean, stats?: TrimStats) {
  return fc.asyncProperty(
    fc.scheduler(),
    inputArb,
    eventsArb,
    fc.tuple(memberArb, memberArb),
    fc.integer({ min: 1, max: 99 }),
    async (s, input, events, specs, percent) => {
      const { world, final } = await runModel(s, input, events, specs, true, { percent, refuse });
      if (stats !== undefined && world.first > 0) {
        stats.trimmed++;
        if (world.refused > 0) stats.refused++;
        else if (exactFold(world, final)) stats.restoredAfterTrim++;
      }
      return world.refused > 0 ? final.offset === -1 && final.kv.size === 0 : exactFold(world, final);
    },
  );
}

/**
 * The restore's reach (revS F1): zombies up to 60 steps late, every member dead for good after the
 * `cut`-th stored reference, a snapshot restore held to the changelog's last entry at its start.
 */
function reachProperty(newest: boolean, stats?: { snapshotRestores: number; cut: number }) {
  return fc.asyncProperty(
    fc.scheduler(),
    inputArb,
    eventsOf(60),
    fc.tuple(memberArb, memberArb),
    fc.option(fc.integer({ min: 1, max: 4 }), { nil: Infinity }),
    async (s, input, events, specs, cut) => {
      const { world, final } = await runModel(s, input, events, specs, true, undefined, { cut, newest });
      if (stats !== undefined) {
        stats.snapshotRestores += world.snapshotRestores;
        if (world.refsToCut <= 0) stats.cut++;
      }
      return exactFold(world, final);
    },
  );
}

describe('consumer group hand-over with changelog snapshots (fc.scheduler model of design §12.1)', () => {
  it('every interleaving of snapshot writes, torn and mixed snapshots, hand-overs, zombies, crashes and lost stores gives the exact fold', async () => {
    const stats = { snapshotRestores: 0 };
    await fc.assert(property(true, stats), { numRuns: 1_000 });
    // The snapshot path is taken, not only the fall-back.
    expect(stats.snapshotRestores).toBeGreaterThan(100);
  });

  it('after retention trimmed the changelog, the take-over restores the exact fold from a kept snapshot or refuses', async () => {
    const stats: TrimStats = { trimmed: 0, refused: 0, restoredAfterTrim: 0 };
    await fc.assert(trimProperty(true, stats), { numRuns: 1_000 });
    console.log(`[group-snapshot trim] ${JSON.stringify(stats)}`);
    // Both outcomes are reached: a snapshot after the trim point, and a refusal.
    expect(stats.restoredAfterTrim).toBeGreaterThan(50);
    expect(stats.refused).toBeGreaterThan(50);
  });

  it('without the marker’s completeness check (count, digest), fast-check finds a restore of a mixed snapshot with a wrong fold', async () => {
    // Found after 456–7 433 runs (20 seeds, mean 2 440): 20 000 missed about once in 4 000 runs of the
    // file (a CI run on Node.js 24 did). fc.check stops at the first failure, so a budget of 80× the
    // mean costs nothing when the model sees the hazard, and misses with odds below e^-80.
    const result = await fc.check(property(false, undefined, true), { numRuns: 200_000 });
    expect(result.failed).toBe(true);
    expect(result.counterexample).not.toBeNull();
  });

  it('with members dying for good after a reference and zombies up to 60 steps late, a snapshot restore reaches the last entry there was when it began', async () => {
    const stats = { snapshotRestores: 0, cut: 0 };
    await fc.assert(reachProperty(true, stats), { numRuns: 2_000 });
    console.log(`[group-snapshot reach] ${JSON.stringify(stats)}`);
    expect(stats.snapshotRestores).toBeGreaterThan(100);
    expect(stats.cut).toBeGreaterThan(100);
  });

  it('the same, pinned seed 2 (where the first-complete-snapshot rule fails after 4 177 runs): no failure in 4 500 runs', async () => {
    await fc.assert(reachProperty(true), { numRuns: 4_500, seed: 2 });
  });

  it('with the first complete snapshot taken (the rule before revS F1), fast-check finds a restore that ends below the last entry (seed 2)', async () => {
    // Seed 2: 4 177 runs, shrunk 33 (a zombie's snapshot of 1 lands between reference 3 and the
    // snapshot of 2 it was stored for; every member dies after it); seed 3: 19 198 runs.
    const result = await fc.check(reachProperty(false), { numRuns: 5_000, seed: 2 });
    expect(result.failed).toBe(true);
  });
});
