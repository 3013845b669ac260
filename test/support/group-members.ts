import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Client } from 'rabbitmq-stream-js-client';
import { afterAll, afterEach, expect } from 'vitest';
import { BROKER } from './broker.js';
import { publishLedger, type Sent } from './group-ledger.js';
import { useSuperStreams } from './superstream.js';

// Consumer group members as processes (test/fixtures/group-member.ts), for the tests that SIGKILL,
// SIGSTOP and fail over under them: the crash test on the single broker and the cluster test.

const fixture = fileURLToPath(new URL('../fixtures/group-member.ts', import.meta.url));

/** Member processes still running: killed after each test, whatever its outcome. */
const running = new Set<ChildProcess>();

/** Kills every member process a test left running, after each test of the file. */
export function useMemberProcesses(): void {
  afterEach(() => {
    for (const child of running) child.kill('SIGKILL');
    running.clear();
  });
}

/** A line a member printed (test/fixtures/group-member.ts), with when the test read it. */
export type Line = Record<string, unknown> & { member: string; at: number };

/** A member's answer to `{ wait }`: the partition's state in its store once it reached the offset. */
export interface Reached {
  member: string;
  reached: string;
  balance: number;
  count: number;
  doubles: string | null;
}

/** One member process: its exit, and when it said it is open. */
export class MemberProcess {
  readonly child: ChildProcess;
  readonly exited: Promise<[number | null, NodeJS.Signals | null]>;
  readonly ready: Promise<void>;
  constructor(
    name: string,
    superStreamName: string,
    store: string,
    env: Record<string, string>,
    onLine: (line: Line) => void,
  ) {
    const child = spawn(process.execPath, ['--import', 'tsx', fixture, superStreamName, store, name], {
      env: { ...process.env, RABBITMQ_STREAM_PORT: String(BROKER.streamPort), ...env },
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    this.child = child;
    running.add(child);
    child.once('exit', () => running.delete(child));
    this.exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    let markReady = (): void => undefined;
    this.ready = new Promise((resolve) => (markReady = resolve));
    void (async () => {
      for await (const text of createInterface({ input: child.stdout })) {
        const line = { ...(JSON.parse(text) as Record<string, unknown>), at: performance.now() } as Line;
        if (line.ready === true) markReady();
        onLine(line);
      }
    })();
  }

  send(line: object): void {
    this.child.stdin!.write(`${JSON.stringify(line)}\n`);
  }
}

/** What a group test is given: the super stream, a client to publish with, and store directories. */
export interface GroupRigOptions {
  client: () => Client;
  superStream: string;
  partitions: readonly string[];
  tempDir: () => Promise<string>;
  /** Extra environment of member i's process (HEARTBEAT, PAUSE_FILE, CLUSTER_PORTS). */
  env?: (member: number) => Record<string, string>;
  /** What the broker says of the group, added to the error of a wait that timed out. */
  diagnose?: () => Promise<string>;
}

export type GroupRig = Awaited<ReturnType<typeof startGroup>>;

/**
 * Two members of group balance-projection, each with its own store, started and holding every
 * partition.
 */
export async function startGroup(options: GroupRigOptions) {
  const { superStream: name, partitions, tempDir } = options;
  const env = options.env ?? (() => ({}));
  const stores = [await tempDir(), await tempDir()];
  const lines: Line[] = [];
  const waiters = new Set<() => void>();
  const onLine = (line: Line): void => {
    lines.push(line);
    for (const check of waiters) check();
  };
  /**
   * Resolves once `done(lines)` holds (checked on every new line); rejects after `ms` naming `what`
   * and the last lines, so that a wait that never ends says which one it was.
   */
  const until = (done: (all: readonly Line[]) => boolean, what: string, ms = 60_000): Promise<void> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        waiters.delete(check);
        const tail = lines.slice(-40).map((l) => JSON.stringify(l));
        const message = `still waiting for ${what} after ${ms} ms; last lines:\n${tail.join('\n')}`;
        void (options.diagnose?.() ?? Promise.resolve(''))
          .catch((err: unknown) => `(the broker's view could not be read: ${String(err)})`)
          .then((view) => reject(new Error(view ? `${message}\nthe broker's view:\n${view}` : message)));
      }, ms);
      const check = (): void => {
        if (!done(lines)) return;
        clearTimeout(timer);
        waiters.delete(check);
        resolve();
      };
      waiters.add(check);
      check();
    });
  const start = (i: number, extra: Record<string, string> = {}): MemberProcess =>
    new MemberProcess(`m${i}`, name, stores[i]!, { ...env(i), ...extra }, onLine);
  // The first two start from 'first': until every partition has committed a round, a partition's
  // holder-to-be (a rebalance can still be on its way when both say they are ready) must not skip
  // what was published before it took over. Members started later start from 'next': by then each
  // partition's changelog has entries, and a member whose store is lost has only those to go by.
  const members = [start(0, { START_FROM: 'first' }), start(1, { START_FROM: 'first' })];
  await Promise.all(members.map((m) => m.ready));
  // Every partition held at once (one given to a member and on its way to the other is not).
  await until((all) => holders(all).size === partitions.length, 'every partition held');
  return { name, partitions, stores, lines, until, start, members, client: options.client, tempDir };
}

/**
 * Groups for one test file (member processes killed after each test, super streams and the
 * group's changelogs deleted after the file): the returned function starts two members of
 * balance-projection on a fresh 3-partition super stream, each with its own store.
 */
export function useGroups(
  client: () => Client,
  tempDir: () => Promise<string>,
): (prefix: string, env?: (member: number) => Record<string, string>) => Promise<GroupRig> {
  const superStream = useSuperStreams(client);
  useMemberProcesses();
  const changelogs: string[] = [];
  afterAll(async () => {
    for (const stream of changelogs)
      await client()
        .deleteStream({ stream })
        .catch(() => undefined);
  });
  return async (prefix, env) => {
    const name = await superStream(prefix);
    const partitions = await client().queryPartitions({ superStream: name });
    changelogs.push(...partitions.map((p) => `${p}.balance-projection.changelog`));
    return startGroup({ client, superStream: name, partitions, tempDir, env });
  };
}

/**
 * The crash test: a first round, then 11 more rounds of 50 messages a partition published while
 * {@link killAtRandom} kills the members (at least `atLeast` times), then every partition's holder
 * checked against the exact fold ({@link expectExactFolds}).
 */
export async function crashRun(
  g: GroupRig,
  sent: Map<string, Sent>,
  atLeast = 12,
): Promise<Kills & { reached: Reached[] }> {
  await firstRound(g, sent);
  let publishing = true;
  const publisher = (async () => {
    for (let round = 1; round < 12; round++)
      await publishLedger(g.client(), g.partitions, 1 + round * 50, 50, sent);
    publishing = false;
  })();
  const kills = await killAtRandom(g, () => publishing, atLeast);
  await publisher;
  await Promise.all(g.members.map((m) => m.ready));
  return { ...kills, reached: await expectExactFolds(g, sent) };
}

/** What {@link killAtRandom} did. */
export interface Kills {
  kills: number;
  lostStores: number;
  /** When the first kill's wait began (performance.now()). */
  from: number;
}

/**
 * The crash tests' nemesis: while `busy()` or until `atLeast` kills, SIGKILLs a member at a random
 * moment (300-1 200 ms apart: its restore, a commit, idle) and restarts it on its store; every
 * fourth kill also loses the member's store (a new machine: it has only the changelog).
 */
export async function killAtRandom(g: GroupRig, busy: () => boolean, atLeast = 12): Promise<Kills> {
  const done: Kills = { kills: 0, lostStores: 0, from: performance.now() };
  while (busy() || done.kills < atLeast) {
    await new Promise((resolve) => setTimeout(resolve, 300 + Math.random() * 900));
    const i = Math.floor(Math.random() * 2);
    const victim = g.members[i]!;
    victim.child.kill('SIGKILL');
    const [, signal] = await victim.exited;
    expect(signal).toBe('SIGKILL');
    done.kills++;
    if (done.kills % 4 === 0) {
      g.stores[i] = await g.tempDir();
      done.lostStores++;
    }
    g.members[i] = g.start(i);
  }
  return done;
}

/** Who holds each partition now, by the members' assignment lines: partitions in hand-over are absent. */
export function holders(lines: readonly Line[]): Map<string, string> {
  const held = new Map<string, string>();
  for (const l of lines) {
    if (l.kind === 'assigned') held.set(String(l.partition), l.member);
    if (l.kind === 'revoked' && held.get(String(l.partition)) === l.member) held.delete(String(l.partition));
  }
  return held;
}

/**
 * Who holds each partition by what it did rather than what it was told: the member of the
 * partition's last commit, unless that member heard it lost the partition since (then it is in
 * hand-over, absent). An 'assigned' line can name a partition the broker has just given to the
 * other member (both members of a pair started together can report the same partition:
 * docs/guides/super-streams-and-groups.md), and `holders` then names a member that never held it;
 * a member commits only a partition it holds (the fence the crash test's pause checks).
 */
export function committers(lines: readonly Line[]): Map<string, string> {
  const held = new Map<string, string>();
  for (const l of lines) {
    if (typeof l.commit === 'string') held.set(l.commit, l.member);
    if (l.kind === 'revoked' && held.get(String(l.partition)) === l.member) held.delete(String(l.partition));
  }
  return held;
}

/**
 * Waits until each partition's holder has committed up to what `sent` says was sent to it, at most
 * `ms` (60 s if not given).
 */
export function committedEverywhere(
  g: GroupRig,
  sent: Map<string, Sent>,
  what: string,
  ms?: number,
): Promise<void> {
  // Committed: a holder reported the commit, or a member took the partition over from a changelog
  // that already holds it. A holder revoked between its changelog append and its commit report
  // never reports that commit (its successor applies it from the changelog): on RabbitMQ 4.3, 1 of
  // 2 cluster runs moved partition 1 right then and waited here for good.
  const reached = (l: Record<string, unknown>, p: string, offset: bigint): boolean =>
    (l.commit === p && BigInt(String(l.lastOffset)) >= offset) ||
    (l.kind === 'assigned' &&
      l.partition === p &&
      typeof l.offset === 'string' &&
      BigInt(l.offset) >= offset);
  return g.until(
    (all) => [...sent].every(([p, s]) => all.some((l) => reached(l, p, s.lastOffset))),
    what,
    ms,
  );
}

/**
 * Publishes the first round and waits until each partition's holder committed it: from then on the
 * changelog of every partition has an entry, and a member that takes one over starts from there,
 * not from `next` (which would skip what came before it).
 */
export async function firstRound(g: GroupRig, sent: Map<string, Sent>): Promise<void> {
  await publishLedger(g.client(), g.partitions, 1, 50, sent);
  await committedEverywhere(g, sent, 'the first round committed in every partition');
}

/**
 * Asks both members for the end state of every partition and checks the holder's against the fold
 * of what was sent (balance, count, no double); then stops both with SIGTERM and expects exit 0.
 */
export async function expectExactFolds(g: GroupRig, sent: Map<string, Sent>): Promise<Reached[]> {
  const from = g.lines.length;
  const targets = Object.fromEntries([...sent].map(([p, s]) => [p, String(s.lastOffset)]));
  for (const m of g.members) m.send({ wait: targets });
  const reached = new Map<string, Reached>();
  await g.until((all) => {
    for (const l of all.slice(from))
      if (typeof l.reached === 'string') reached.set(l.reached, l as unknown as Reached);
    return reached.size === sent.size;
  }, 'every partition reached in its holder');
  expect(
    g.lines.filter((l) => typeof l.failed === 'string').map((l) => `${l.member}: ${String(l.failed)}`),
  ).toEqual([]);
  for (const [partition, s] of sent) {
    const r = reached.get(partition)!;
    expect({ partition, balance: r.balance, count: r.count, doubles: r.doubles }).toEqual({
      partition,
      balance: s.balance,
      count: s.distinct,
      doubles: null,
    });
  }
  for (const m of g.members) m.child.kill('SIGTERM');
  const exits = await Promise.all(g.members.map((m) => m.exited));
  expect(exits.map(([code]) => code)).toEqual([0, 0]);
  return [...reached.values()];
}

/** `p0@m1: 1234/56 …`: where each partition ended, for the test's summary line. */
export function describeReached(g: GroupRig, reached: readonly Reached[]): string {
  return reached
    .map((r) => `${r.reached.slice(g.name.length)}@${r.member}: ${r.balance}/${r.count}`)
    .join(' ');
}
