/**
 * The consumer group's hand-over model (property-tests/group-handover.test.ts) with what it lacked:
 * two groups whose changelog names would collide, and a changelog writer the broker refuses.
 *
 * Two groups, each with two members handing its partition over (fc.scheduler interleaves every
 * step: restore reads, appends, confirms, local commits, hand-overs heard late, crashes). Their
 * changelogs are named by the real `changelogStreamName`, `open()` is the real `checkGroupName`,
 * and every record a restore or a genesis read-back reads goes through the real `ownIdentity`.
 * The broker keeps one last ID per (stream, producer name), as RabbitMQ does. Properties: a group
 * either is refused at open or ends with its exact fold — no member ever applies another group's
 * record, none stops.
 *
 * Then the member's append loop (as in src/group/partition.ts: a refused append stops the member,
 * any other failure drops the batch and takes the partition over again, re-running the handler)
 * over the real `ChangelogWriter` and a transport the broker refuses after transient failures: the
 * member ends with DEDUP_BROKER_REFUSED within a bounded number of handler runs.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ChangelogWriter, type ChangelogTransport } from '../src/group/changelog-writer.js';
import { changelogProducerName, changelogStreamName, checkGroupName } from '../src/group/consumer.js';
import { ownIdentity } from '../src/group/changelog-identity.js';
import { DedupError } from '../src/errors.js';
import { ID_HEADER, PRODUCER_HEADER } from '../src/identity/headers.js';
import type { TransportHandlers } from '../src/publisher/types.js';
import { silentLogger } from '../src/telemetry/logger.js';
import { StreamDoesNotExistError, StreamNotAvailableError } from '../src/transport/util.js';

type Rec =
  | { readonly producer: string; readonly id: number; readonly kind: 'genesis'; readonly start: number }
  | {
      readonly producer: string;
      readonly id: number;
      readonly kind: 'entry';
      readonly base: number;
      readonly last: number;
      readonly values: ReadonlyMap<string, number>;
    };

/** The broker: streams by name, and the last ID of each (stream, producer). */
interface Broker {
  readonly streams: Map<string, Rec[]>;
  readonly lastIds: Map<string, number>;
}

const lastIdKey = (stream: string, producer: string): string => `${stream}\u0000${producer}`;

interface Member {
  offset: number;
  kv: Map<string, number>;
  epoch: number;
}

interface Group {
  readonly name: string;
  readonly partition: string;
  readonly stream: string;
  readonly producer: string;
  /** The partition's input: amounts, one per offset. */
  readonly input: readonly number[];
  /** Where a member with nothing restored and no genesis begins (startFrom 'next': the end then). */
  readonly start: number;
  readonly members: [Member, Member];
  /** Records of another producer a member applied (or began from). */
  foreign: number;
  /** Why a member stopped (the member's error code), if one did. */
  stopped: string | undefined;
}

/** The real check of every changelog reader, on a record of the model's changelog. */
function own(g: Group, rec: Rec, where: string): boolean {
  try {
    ownIdentity(
      { applicationProperties: { [PRODUCER_HEADER]: rec.producer, [ID_HEADER]: String(rec.id) } },
      g.producer,
      where,
    );
    return true;
  } catch (err) {
    g.stopped ??= (err as DedupError).code;
    return false;
  }
}

async function restore(
  s: fc.Scheduler,
  broker: Broker,
  g: Group,
  m: Member,
  epoch: number,
): Promise<{ start: number | undefined } | undefined> {
  const lastId = broker.lastIds.get(lastIdKey(g.stream, g.producer)) ?? 0;
  if (lastId <= (m.offset === -1 ? 0 : m.offset + 2)) return { start: undefined };
  const records = broker.streams.get(g.stream) ?? [];
  let start: number | undefined;
  let lastSeen = 0;
  for (let i = 0; i < records.length && lastSeen < lastId; i++) {
    await s.schedule(Promise.resolve(), `${g.name} reads record ${i}`);
    if (m.epoch !== epoch || g.stopped !== undefined) return undefined;
    const rec = records[i]!;
    if (!own(g, rec, `at offset ${i}`)) return undefined;
    if (rec.id <= lastSeen) {
      g.stopped ??= 'DEDUP_CHANGELOG_INVALID';
      return undefined;
    }
    lastSeen = rec.id;
    if (rec.producer !== g.producer) g.foreign++;
    if (rec.kind === 'genesis') {
      if (m.offset === -1) start = rec.start;
      continue;
    }
    if (rec.last <= m.offset) continue;
    if (rec.base > m.offset) {
      g.stopped ??= 'DEDUP_CHANGELOG_INVALID'; // a hole
      return undefined;
    }
    for (const [k, v] of rec.values) m.kv.set(k, v);
    m.offset = rec.last;
  }
  return { start };
}

/** Appends `rec` if the broker keeps it (ID above the producer's last); answers the last ID after. */
function append(broker: Broker, g: Group, rec: Rec): number {
  const key = lastIdKey(g.stream, g.producer);
  const last = broker.lastIds.get(key) ?? 0;
  if (rec.id > last) {
    const records = broker.streams.get(g.stream) ?? [];
    broker.streams.set(g.stream, records);
    records.push(rec);
    broker.lastIds.set(key, rec.id);
  }
  return broker.lastIds.get(key)!;
}

async function hold(s: fc.Scheduler, broker: Broker, g: Group, m: Member, batch: number, name: string) {
  const epoch = m.epoch;
  const restored = await restore(s, broker, g, m, epoch);
  if (restored === undefined) return;
  let needsGenesis = false;
  let from: number;
  if (m.offset !== -1) from = m.offset + 1;
  else if (restored.start !== undefined) from = restored.start;
  else {
    from = g.start;
    needsGenesis = true;
  }
  while (from <= g.input.length - 1 && g.stopped === undefined) {
    const last = Math.min(g.input.length - 1, from + batch - 1);
    const written = new Map<string, number>();
    if (m.offset === -1) written.set('start', from);
    let balance = m.kv.get('balance') ?? 0;
    for (let o = from; o <= last; o++) balance += g.input[o]!;
    written.set('balance', balance);
    if (needsGenesis) {
      await s.schedule(Promise.resolve(), `${name} appends the genesis at ${from}`);
      if (m.epoch !== epoch) return;
      append(broker, g, { producer: g.producer, id: 1, kind: 'genesis', start: from });
      await s.schedule(Promise.resolve(), `${name} reads the genesis back`);
      if (m.epoch !== epoch) return;
      // readGenesis: the first message of the changelog stream, whoever wrote it.
      const head = broker.streams.get(g.stream)![0]!;
      if (!own(g, head, 'at the head')) return;
      if (head.kind !== 'genesis' || head.start !== from) {
        if (head.producer !== g.producer) g.foreign++; // it begins again where that says
        return; // fenced
      }
      needsGenesis = false;
    }
    await s.schedule(Promise.resolve(), `${name} appends ${from}..${last}`);
    if (m.epoch !== epoch) return;
    const id = last + 2;
    const after = append(broker, g, {
      producer: g.producer,
      id,
      kind: 'entry',
      base: m.offset,
      last,
      values: written,
    });
    await s.schedule(Promise.resolve(), `${name} confirm of ${id}`);
    if (m.epoch !== epoch || after > id) return;
    for (const [k, v] of written) m.kv.set(k, v);
    m.offset = last;
    from = last + 1;
  }
}

type Event = 'handover' | 'crash';

interface GroupSpec {
  readonly name: string;
  readonly partition: string;
  readonly input: readonly number[];
  readonly start: number;
  readonly events: readonly Event[];
  readonly batch: number;
}

/** One group's run: member 0 first, events hand over or crash, then the last holder alone to the end. */
async function runGroup(s: fc.Scheduler, broker: Broker, g: Group, spec: GroupSpec): Promise<Member> {
  let holder = 0;
  const runs: Promise<void>[] = [];
  const start = (i: number): void => {
    g.members[i]!.epoch++;
    runs.push(hold(s, broker, g, g.members[i]!, spec.batch, `${g.name}/m${i}`));
  };
  start(holder);
  for (const [n, event] of spec.events.entries()) {
    runs.push(
      s.schedule(Promise.resolve(), `${g.name} event ${n}: ${event}`).then(async () => {
        const old = holder;
        if (event === 'crash') return start(old);
        holder = 1 - old;
        start(holder);
        await s.schedule(Promise.resolve(), `${g.name}/m${old} hears it lost the partition`);
        g.members[old]!.epoch++;
      }),
    );
  }
  await Promise.all(runs);
  const last = g.members[holder]!;
  last.epoch++;
  await hold(s, broker, g, last, g.input.length, `${g.name}/final`);
  return last;
}

const newMember = (): Member => ({ offset: -1, kv: new Map(), epoch: 0 });

const groupArb = (name: fc.Arbitrary<string>, partition: fc.Arbitrary<string>): fc.Arbitrary<GroupSpec> =>
  fc
    .record({
      name,
      partition,
      input: fc.array(fc.integer({ min: 1, max: 9 }), { minLength: 2, maxLength: 10 }),
      events: fc.array(fc.constantFrom<Event>('handover', 'crash'), { maxLength: 3 }),
      batch: fc.integer({ min: 1, max: 3 }),
      startAt: fc.nat(),
    })
    .map(({ startAt, ...g }) => ({ ...g, start: startAt % g.input.length }));

/** Names from a small alphabet with dots, and the pair (whose changelogs collide under 0.5.0). */
const nameArb = fc.string({ unit: fc.constantFrom('a', 'b', '.'), minLength: 1, maxLength: 4 });
const pairArb = fc.oneof(
  fc.tuple(
    groupArb(fc.constant('billing'), fc.constant('orders-eu.west')),
    groupArb(fc.constant('west.billing'), fc.constant('orders-eu')),
  ),
  fc.tuple(groupArb(nameArb, nameArb), groupArb(nameArb, nameArb)),
);

describe('consumer groups whose changelog names would collide (fc.scheduler model)', () => {
  it('each group is refused at open or ends with its exact fold: no member applies another group’s record', async () => {
    await fc.assert(
      fc.asyncProperty(fc.scheduler(), pairArb, async (s, specs) => {
        fc.pre(specs[0].name !== specs[1].name || specs[0].partition !== specs[1].partition);
        const broker: Broker = { streams: new Map(), lastIds: new Map() };
        const groups: Array<[Group, GroupSpec]> = [];
        for (const spec of specs) {
          try {
            checkGroupName(spec.name); // open(), before any I/O
          } catch {
            continue;
          }
          const g: Group = {
            name: spec.name,
            partition: spec.partition,
            stream: changelogStreamName(spec.partition, spec.name),
            producer: changelogProducerName(spec.name),
            input: spec.input,
            start: spec.start,
            members: [newMember(), newMember()],
            foreign: 0,
            stopped: undefined,
          };
          groups.push([g, spec]);
        }
        const holders = await s.waitFor(Promise.all(groups.map(([g, spec]) => runGroup(s, broker, g, spec))));
        groups.forEach(([g], i) => {
          const holder = holders[i]!;
          const start = holder.kv.get('start');
          const expected = g.input.slice(start).reduce((a, b) => a + b, 0);
          expect({ group: g.name, foreign: g.foreign, stopped: g.stopped }).toEqual({
            group: g.name,
            foreign: 0,
            stopped: undefined,
          });
          expect({ offset: holder.offset, balance: holder.kv.get('balance') }).toEqual({
            offset: g.input.length - 1,
            balance: expected,
          });
        });
      }),
      { numRuns: 500 },
    );
  });
});

/** "Does not exist" as the stream transport reports it: with the create's own error (`create`). */
const missingAfterCreate = (create: Error): StreamDoesNotExistError =>
  new StreamDoesNotExistError(`the stream does not exist, and creating it failed: ${create.message}`, {
    cause: new AggregateError([
      new Error('Declare Publisher command returned error with code 2 - Stream does not exist'),
      create,
    ]),
  });

/**
 * A transport that fails `transient` connects (an election, a node down, a changelog not created
 * yet because its create timed out), then is refused for good.
 */
function refusingTransport(
  transient: readonly ('election' | 'down' | 'notYet')[],
  refusal: 'access' | 'vhost' | 'missing',
): ChangelogTransport & { connects: number } {
  const cause = {
    access: () => new Error('Declare Publisher command returned error with code 16 - Access Refused'),
    vhost: () => new Error('Declare Publisher command returned error with code 12 - VHost Access Failure'),
    // The create refused for good: no permission to make the changelog.
    missing: () =>
      missingAfterCreate(new Error('Create Stream command returned error with code 16 - Access Refused')),
  }[refusal];
  const refused = (e: Error) => new DedupError('DEDUP_BROKER_REFUSED', `refused: ${e.message}`, { cause: e });
  const t = {
    connects: 0,
    maxMessageBytes: 1 << 20,
    connect(_h: TransportHandlers): Promise<bigint> {
      const kind = transient[t.connects++];
      if (kind === 'election') return Promise.reject(refused(new StreamNotAvailableError('no leader')));
      if (kind === 'down')
        return Promise.reject(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }));
      // A rolling restart: the create timed out, the declaration truthfully says "does not exist";
      // the next connect creates it. Not a refusal (hostile review: it stopped healthy groups).
      if (kind === 'notYet')
        return Promise.reject(refused(missingAfterCreate(new Error('timed out creating stream'))));
      return Promise.reject(refused(cause()));
    },
    publish: () => Promise.resolve(),
    queryLastId: () => Promise.resolve(0n),
    close: () => Promise.resolve(),
  };
  return t;
}

describe('a changelog writer the broker refuses (member append loop over the real ChangelogWriter)', () => {
  it('ends the member with DEDUP_BROKER_REFUSED, the broker code kept, after one handler run: no livelock', async () => {
    /** Handler runs after which the loop counts as a livelock. */
    const LIVELOCK = 5;
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.constantFrom<'election' | 'down' | 'notYet'>('election', 'down', 'notYet'), {
          maxLength: 3,
        }),
        fc.constantFrom<'access' | 'vhost' | 'missing'>('access', 'vhost', 'missing'),
        async (transient, refusal) => {
          const transport = refusingTransport(transient, refusal);
          const writer = new ChangelogWriter({
            stream: 'orders-0.billing.changelog',
            producerName: changelogProducerName('billing'),
            connection: undefined,
            connectTimeoutMs: 50,
            appendTimeoutMs: 40,
            reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
            logger: silentLogger,
            transport,
          });
          let handlerRuns = 0;
          let stoppedWith: unknown;
          // The member: take over (restore), run the handler over the batch, append, commit.
          while (stoppedWith === undefined && handlerRuns < LIVELOCK) {
            handlerRuns++;
            try {
              await writer.append(Buffer.from('entry'), 2n, () => true);
              break;
            } catch (err) {
              // src/group/partition.ts #append: refused or invalid stops the member; else a retake.
              const code = (err as DedupError).code;
              if (code === 'DEDUP_BROKER_REFUSED' || code === 'DEDUP_CHANGELOG_INVALID') stoppedWith = err;
            }
          }
          await writer.close();
          expect(stoppedWith).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
          expect((stoppedWith as Error).message).toMatch(/broker response code (16|12)\b/);
          expect(handlerRuns).toBe(1);
        },
      ),
      { numRuns: 60 },
    );
  });
});
