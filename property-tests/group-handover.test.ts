/**
 * The consumer group's hand-over protocol (docs/design.md §12) as a model: one partition, two
 * members with their own stores, the broker's single active consumer moving the partition between
 * them, and the partition's changelog. fc.scheduler interleaves every step: a member reading the
 * changelog, appending a batch, the confirm, its local commit, the broker's hand-over, the old
 * holder hearing of it (until then it is a zombie that goes on), and crashes.
 *
 * The real protocol keeps two guards against a zombie's stale batch: the broker drops a
 * changelog entry whose ID (last offset + 1) is not above the last one (and the writer, seeing a
 * higher last ID, drops the batch), and a restore skips entries at or below the store's offset.
 * With both, or either, the fold is exact; with neither, fast-check finds the double effect.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

/** The partition: credit events, some of them planted redeliveries (same ID again). */
interface Input {
  readonly id: number;
  readonly amount: number;
}

interface Entry {
  /** Offset of the state the batch was computed on (-1: the first batch). */
  readonly base: number;
  readonly last: number;
  readonly values: ReadonlyMap<string, number>;
}

interface Guards {
  /** The broker keeps one entry per ID and drops one not above the last; the writer sees it. */
  readonly brokerFencing: boolean;
  /** A restore skips entries at or below the store's offset (and refuses a hole). */
  readonly restoreSkips: boolean;
}

interface Member {
  /** The member's store: its offset and values (survive a crash). */
  offset: number;
  kv: Map<string, number>;
  /** Bumped when the member crashes or hears it lost the partition: its run in progress ends. */
  epoch: number;
}

interface World {
  readonly input: readonly Input[];
  readonly changelog: Entry[];
  lastId: number;
  readonly members: [Member, Member];
  doubles: number;
  holes: number;
}

function newMember(): Member {
  return { offset: -1, kv: new Map(), epoch: 0 };
}

/** The verifier, then the handler: balance and count, a mark per applied ID; a second application of an ID is a double. */
function applyMessage(kv: Map<string, number>, world: World, message: Input): void {
  // The verifier: one state per producer scope (here the highest ID, the input's IDs increase).
  if (message.id <= (kv.get('tracker') ?? 0)) return; // a redelivery
  kv.set('tracker', message.id);
  if (kv.get(`applied:${message.id}`) === 1) world.doubles++;
  kv.set(`applied:${message.id}`, 1);
  kv.set('balance', (kv.get('balance') ?? 0) + message.amount);
  kv.set('count', (kv.get('count') ?? 0) + 1);
}

/** Restores member `m` from the changelog, one entry per scheduled step. */
async function restore(
  s: fc.Scheduler,
  world: World,
  m: Member,
  epoch: number,
  guards: Guards,
): Promise<boolean> {
  for (let i = 0; i < world.changelog.length; i++) {
    await s.schedule(Promise.resolve(), `read entry ${i}`);
    if (m.epoch !== epoch) return false;
    const entry = world.changelog[i]!;
    if (guards.restoreSkips) {
      if (entry.last <= m.offset) continue;
      if (entry.base > m.offset) {
        world.holes++;
        return false;
      }
    }
    for (const [k, v] of entry.values) m.kv.set(k, v);
    m.offset = entry.last;
  }
  return true;
}

/**
 * One period of member `m` as the partition's holder (as far as it knows): restore, then batches
 * of `batchSize` until the input ends or the period ends (crash, heard of the loss, fenced).
 */
async function hold(
  s: fc.Scheduler,
  world: World,
  m: Member,
  guards: Guards,
  batchSize: number,
  name: string,
): Promise<void> {
  const epoch = m.epoch;
  if (!(await restore(s, world, m, epoch, guards))) return;
  while (m.offset < world.input.length - 1) {
    // The batch is computed on the member's own state (what it committed or restored).
    const working = new Map(m.kv);
    const base = m.offset;
    const last = Math.min(world.input.length - 1, base + batchSize);
    const written = new Map<string, number>();
    for (let o = base + 1; o <= last; o++) {
      const before = new Map(working);
      applyMessage(working, world, world.input[o]!);
      for (const [k, v] of working) if (before.get(k) !== v) written.set(k, v);
    }
    written.set('offset', last);
    await s.schedule(Promise.resolve(), `${name} appends ${base + 1}..${last}`);
    if (m.epoch !== epoch) return; // crashed before the append left
    const id = last + 1;
    if (!guards.brokerFencing || id > world.lastId) {
      world.changelog.push({ base, last, values: written });
      world.lastId = guards.brokerFencing ? id : Math.max(world.lastId, id);
    }
    await s.schedule(Promise.resolve(), `${name} confirm of ${id}`);
    if (m.epoch !== epoch) return;
    if (guards.brokerFencing && world.lastId > id) return; // fenced: the batch is not committed
    await s.schedule(Promise.resolve(), `${name} commits ${base + 1}..${last} locally`);
    if (m.epoch !== epoch) return;
    for (const [k, v] of written) if (k !== 'offset') m.kv.set(k, v);
    m.offset = last;
  }
}

/** Credit events with planted redeliveries: a repeat of an earlier message's ID and amount. */
const inputArb = fc
  .array(fc.record({ amount: fc.integer({ min: 1, max: 9 }), repeat: fc.boolean() }), {
    minLength: 4,
    maxLength: 16,
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

type Event = { kind: 'handover' } | { kind: 'crash' };
const eventsArb = fc.array(
  fc.oneof(fc.constant<Event>({ kind: 'handover' }), fc.constant<Event>({ kind: 'crash' })),
  { minLength: 1, maxLength: 4 },
);

/**
 * Runs the model: member 0 holds the partition first; each event (scheduled among the members'
 * steps) hands the partition to the other member — the old holder hears of it only later, at a
 * scheduled moment, and goes on as a zombie until then — or crashes the holder, which takes the
 * partition back after its restart. At the end the last holder runs alone to the end of the input.
 */
async function runModel(
  s: fc.Scheduler,
  input: readonly Input[],
  events: readonly Event[],
  batchSizes: readonly [number, number],
  guards: Guards,
): Promise<{ world: World; holder: Member }> {
  const world: World = {
    input,
    changelog: [],
    lastId: 0,
    members: [newMember(), newMember()],
    doubles: 0,
    holes: 0,
  };
  let holder = 0;
  const runs: Promise<void>[] = [];
  // A new period supersedes any older one of the same member (its core is closed first).
  const start = (i: number): void => {
    world.members[i]!.epoch++;
    runs.push(hold(s, world, world.members[i]!, guards, batchSizes[i]!, `m${i}`));
  };
  start(holder);
  for (const [n, event] of events.entries()) {
    runs.push(
      s.schedule(Promise.resolve(), `event ${n}: ${event.kind}`).then(async () => {
        const old = holder;
        if (event.kind === 'crash') {
          start(old); // what was in memory is gone; the store stays
          return;
        }
        holder = 1 - old;
        start(holder);
        // The old holder hears of the hand-over only later: until then, a zombie.
        await s.schedule(Promise.resolve(), `m${old} hears it lost the partition`);
        world.members[old]!.epoch++;
      }),
    );
  }
  await s.waitFor(Promise.all(runs));
  await s.waitAll();
  // The last holder, alone: a restart from its store, then to the end of the input.
  const last = world.members[holder]!;
  last.epoch++;
  const final = hold(s, world, last, guards, input.length, 'final');
  await s.waitFor(final);
  return { world, holder: last };
}

function expectedFold(input: readonly Input[]): { balance: number; count: number } {
  const seen = new Set<number>();
  let balance = 0;
  for (const m of input) {
    if (seen.has(m.id)) continue;
    seen.add(m.id);
    balance += m.amount;
  }
  return { balance, count: seen.size };
}

/** Each member's batch size. */
const batchArb = fc.tuple(fc.integer({ min: 1, max: 4 }), fc.integer({ min: 1, max: 4 }));

/** The model over arbitrary inputs, events, batch sizes and interleavings, judged by `check`. */
function modelProperty(
  guards: Guards,
  check: (run: { world: World; holder: Member }, input: readonly Input[]) => boolean | void,
): fc.IAsyncPropertyWithHooks<[fc.Scheduler, Input[], Event[], [number, number]]> {
  return fc.asyncProperty(fc.scheduler(), inputArb, eventsArb, batchArb, async (s, input, events, batch) =>
    check(await runModel(s, input, events, batch, guards), input),
  );
}

describe('consumer group hand-over (fc.scheduler model of docs/design.md §12)', () => {
  const guarded: Array<[string, Guards]> = [
    ['broker fencing and restore skips (the protocol)', { brokerFencing: true, restoreSkips: true }],
    ['broker fencing alone', { brokerFencing: true, restoreSkips: false }],
    ['restore skips alone', { brokerFencing: false, restoreSkips: true }],
  ];
  for (const [label, guards] of guarded) {
    it(`${label}: every interleaving of hand-overs, zombies and crashes gives the exact fold`, async () => {
      await fc.assert(
        modelProperty(guards, ({ world, holder }, input) => {
          expect({
            doubles: world.doubles,
            holes: world.holes,
            offset: holder.offset,
            balance: holder.kv.get('balance'),
            count: holder.kv.get('count'),
          }).toEqual({ doubles: 0, holes: 0, offset: input.length - 1, ...expectedFold(input) });
        }),
        { numRuns: 1_000 },
      );
    });
  }

  it('without either guard, a zombie’s stale batch lands after newer ones and fast-check finds the double effect', async () => {
    const result = await fc.check(
      modelProperty({ brokerFencing: false, restoreSkips: false }, ({ world }) => world.doubles === 0),
      { numRuns: 2_000 },
    );
    expect(result.failed).toBe(true);
    expect(result.counterexample).not.toBeNull();
  });
});
