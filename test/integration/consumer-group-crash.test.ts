import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { BROKER } from '../support/broker.js';
import { ledgerIds, publishLedger, type Sent } from '../support/group-ledger.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

const fixture = fileURLToPath(new URL('../fixtures/group-member.ts', import.meta.url));
const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
const changelogs: string[] = [];
/** Member processes still running: killed after each test, whatever its outcome. */
const running = new Set<ChildProcess>();
afterEach(() => {
  for (const child of running) child.kill('SIGKILL');
  running.clear();
});
afterAll(async () => {
  for (const stream of changelogs)
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
});

/** A line a member printed (test/fixtures/group-member.ts), with when the test read it. */
type Line = Record<string, unknown> & { member: string; at: number };

interface Reached {
  member: string;
  reached: string;
  balance: number;
  count: number;
  doubles: string | null;
}

/** One member process: its exit, and when it said it is open. */
class MemberProcess {
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
      env: { ...process.env, ...env, RABBITMQ_STREAM_PORT: String(BROKER.streamPort) },
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

/** Two members of group balance-projection on a fresh 3-partition super stream, each with its own store. */
async function group(prefix: string, env: (member: number) => Record<string, string> = () => ({})) {
  const name = await superStream(prefix);
  const partitions = await client().queryPartitions({ superStream: name });
  changelogs.push(...partitions.map((p) => `${p}.balance-projection.changelog`));
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
        const tail = lines.slice(-15).map((l) => JSON.stringify(l));
        reject(new Error(`still waiting for ${what} after ${ms} ms; last lines:\n${tail.join('\n')}`));
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
  const start = (i: number): MemberProcess => new MemberProcess(`m${i}`, name, stores[i]!, env(i), onLine);
  const members = [start(0), start(1)];
  await Promise.all(members.map((m) => m.ready));
  // Every partition held before the first message (members start from `next`).
  await until(
    (all) => new Set(all.filter((l) => l.kind === 'assigned').map((l) => l.partition)).size === 3,
    'every partition held',
  );
  return { name, partitions, stores, lines, until, start, members };
}

/**
 * Publishes the first round and waits until each partition's holder committed it: from then on the
 * changelog of every partition has an entry, and a member that takes one over starts from there,
 * not from `next` (which would skip what came before it).
 */
async function firstRound(g: Awaited<ReturnType<typeof group>>, sent: Map<string, Sent>): Promise<void> {
  await publishLedger(client(), g.partitions, 1, 50, sent);
  await g.until(
    (all) =>
      [...sent].every(([p, s]) =>
        all.some((l) => l.commit === p && BigInt(String(l.lastOffset)) >= s.lastOffset),
      ),
    'the first round committed in every partition',
  );
}

/** Asks both members for the end state of every partition; checks the holder's against the fold of what was sent. */
async function expectExactFolds(
  g: Awaited<ReturnType<typeof group>>,
  sent: Map<string, Sent>,
): Promise<Reached[]> {
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
  if (process.env.GROUP_TEST_DUMP !== undefined) {
    (await import('node:fs')).writeFileSync(
      process.env.GROUP_TEST_DUMP,
      g.lines.map((l) => JSON.stringify(l)).join('\n'),
    );
  }
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

describe('consumer group under faults (two member processes, separate stores)', () => {
  it('members killed and restarted at random (some with their store lost) while partitions move: each partition’s holder ends with the exact fold', async () => {
    const g = await group('group-crash');
    const sent = new Map<string, Sent>();
    await firstRound(g, sent);
    let publishing = true;
    const publisher = (async () => {
      for (let round = 1; round < 12; round++)
        await publishLedger(client(), g.partitions, 1 + round * 50, 50, sent);
      publishing = false;
    })();

    // The nemesis: SIGKILL a member at a random moment (its restore, a commit, idle), restart it on its store.
    let kills = 0;
    let lostStores = 0;
    while (publishing || kills < 12) {
      await new Promise((resolve) => setTimeout(resolve, 300 + Math.random() * 900));
      const i = Math.floor(Math.random() * 2);
      const victim = g.members[i]!;
      victim.child.kill('SIGKILL');
      const [, signal] = await victim.exited;
      expect(signal).toBe('SIGKILL');
      kills++;
      // Every fourth kill also loses the member's store (a new machine): it has only the changelog.
      if (kills % 4 === 0) {
        g.stores[i] = await tempDir();
        lostStores++;
      }
      g.members[i] = g.start(i);
    }
    await publisher;
    await Promise.all(g.members.map((m) => m.ready));

    const reached = await expectExactFolds(g, sent);
    const assigned = g.lines.filter((l) => l.kind === 'assigned').length;
    console.log(
      `[group crash] kills=${kills} (${lostStores} with the store lost) assignments=${assigned} messages=${[
        ...sent.values(),
      ]
        .map((s) => s.lastOffset + 1n)
        .join('/')} ` +
        reached
          .map((r) => `${r.reached.slice(g.name.length)}@${r.member}: ${r.balance}/${r.count}`)
          .join(' '),
    );
    expect(kills).toBeGreaterThanOrEqual(10);
    // Partitions moved: many more assignments than one per partition.
    expect(assigned).toBeGreaterThan(g.partitions.length * 3);
  });

  it('a member paused past its heartbeat (SIGSTOP, then SIGCONT) commits nothing of the partitions it lost', async () => {
    const dir = await tempDir();
    const pauseFile = (i: number): string => join(dir, `pause-m${i}`);
    const g = await group('group-pause', (i) => ({ HEARTBEAT: '2', PAUSE_FILE: pauseFile(i) }));
    const sent = new Map<string, Sent>();
    await firstRound(g, sent);
    // The member holding the most partitions stops itself at a commit, its batch not yet in the
    // changelog, and stays stopped past its 2 s heartbeat.
    const holders = new Map<string, string>();
    for (const l of g.lines) {
      if (l.kind === 'assigned') holders.set(String(l.partition), l.member);
      if (l.kind === 'revoked' && holders.get(String(l.partition)) === l.member)
        holders.delete(String(l.partition));
    }
    const count = (m: string): number => [...holders.values()].filter((h) => h === m).length;
    const paused = count('m0') >= count('m1') ? 0 : 1;
    const pausedName = `m${paused}`;
    const other = `m${1 - paused}`;
    const lost = [...holders].filter(([, h]) => h === pausedName).map(([p]) => p);
    expect(lost.length).toBeGreaterThan(0);
    // It stops at its commit of the burst's last message in one of its partitions; the other
    // member then takes over and commits that same batch end (the same changelog ID): only the
    // paused member's own check that it lost the partition keeps it from committing it too.
    const target = lost[0]!;
    const end = sent.get(target)!.lastOffset + BigInt(ledgerIds(51, 25).length);
    writeFileSync(pauseFile(paused), `${target} ${end}`);
    await publishLedger(client(), g.partitions, 51, 25, sent);
    expect(sent.get(target)!.lastOffset).toBe(end);
    await g.until(
      (all) => all.some((l) => l.member === pausedName && l.pausing === target),
      `${pausedName} stopping itself at its commit of ${target} up to ${end}`,
    );
    const stoppedAt = performance.now();
    // The broker gives the paused member's partitions to the other one once its heartbeat times out.
    await g.until(
      (all) =>
        lost.every((p) =>
          all.some(
            (l) => l.member === other && l.kind === 'assigned' && l.partition === p && l.at > stoppedAt,
          ),
        ) &&
        all.some((l) => l.member === other && l.commit === target && BigInt(String(l.lastOffset)) >= end),
      `${other} taking over ${lost.join(', ')} and committing ${target} up to ${end}`,
    );
    const heldAfterMs = performance.now() - stoppedAt;
    const pausedAt = g.lines.find((l) => typeof l.pausing === 'string')!;
    g.members[paused]!.child.kill('SIGCONT');
    const resumedAt = performance.now();
    // It hears of the loss: a revocation of each partition it held.
    await g.until(
      (all) =>
        lost.every((p) =>
          all.some(
            (l) => l.member === pausedName && l.kind === 'revoked' && l.partition === p && l.at > resumedAt,
          ),
        ),
      `${pausedName} hearing it lost ${lost.join(', ')}`,
    );
    await publishLedger(client(), g.partitions, 76, 100, sent);
    const reached = await expectExactFolds(g, sent);

    // After SIGCONT, a commit of a lost partition by the paused member only after it was given it again.
    const afterResume = g.lines.filter((l) => l.member === pausedName && l.at > resumedAt);
    const late: string[] = [];
    for (const p of lost) {
      for (const l of afterResume) {
        if (l.kind === 'assigned' && l.partition === p) break;
        if (l.commit === p) late.push(`${p} up to ${String(l.lastOffset)}`);
      }
    }
    console.log(
      `[group pause] ${pausedName} paused ${(heldAfterMs / 1000).toFixed(1)} s at its commit of ` +
        `${String(pausedAt.pausing).slice(g.name.length)} up to ${String(pausedAt.lastOffset)}, holding ${lost
          .map((p) => p.slice(g.name.length))
          .join(
            ',',
          )}; after SIGCONT: ${afterResume.filter((l) => typeof l.commit === 'string').length} commits, ` +
        `late commits of lost partitions: ${late.length}; ` +
        reached
          .map((r) => `${r.reached.slice(g.name.length)}@${r.member}: ${r.balance}/${r.count}`)
          .join(' '),
    );
    expect(late).toEqual([]);
  });
});
