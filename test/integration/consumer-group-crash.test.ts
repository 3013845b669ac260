import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { BROKER } from '../support/broker.js';
import { publishLedger, type Sent } from '../support/group-ledger.js';
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

interface Reached {
  member: string;
  reached: string;
  balance: number;
  count: number;
  doubles: string | null;
}

/** One member process: its lines as they come, its exit. */
class MemberProcess {
  readonly child: ChildProcess;
  readonly exited: Promise<[number | null, NodeJS.Signals | null]>;
  readonly ready: Promise<void>;
  constructor(
    readonly name: string,
    superStreamName: string,
    store: string,
    onLine: (line: Record<string, unknown>) => void,
  ) {
    const child = spawn(process.execPath, ['--import', 'tsx', fixture, superStreamName, store, name], {
      env: { ...process.env, RABBITMQ_STREAM_PORT: String(BROKER.streamPort) },
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
        const line = JSON.parse(text) as Record<string, unknown>;
        if (line.ready === true) markReady();
        onLine(line);
      }
    })();
  }

  send(line: object): void {
    this.child.stdin!.write(`${JSON.stringify(line)}\n`);
  }
}

describe('consumer group under SIGKILL (two member processes, separate stores)', () => {
  it('members killed and restarted at random (some with their store lost) while partitions move: each partition’s holder ends with the exact fold', async () => {
    const name = await superStream('group-crash');
    const partitions = await client().queryPartitions({ superStream: name });
    changelogs.push(...partitions.map((p) => `${p}.balance-projection.changelog`));
    const stores = [await tempDir(), await tempDir()];
    const lines: Record<string, unknown>[] = [];
    const failures: string[] = [];
    const reached = new Map<string, Reached>();
    let onReached = (): void => undefined;
    let onHeld = (partition: string): void => void partition;
    const onLine = (line: Record<string, unknown>): void => {
      lines.push(line);
      if (line.kind === 'assigned') onHeld(String(line.partition));
      if (typeof line.failed === 'string') failures.push(`${String(line.member)}: ${line.failed}`);
      if (typeof line.reached === 'string') {
        reached.set(line.reached, line as unknown as Reached);
        onReached();
      }
    };
    const start = (i: number): MemberProcess => new MemberProcess(`m${i}`, name, stores[i]!, onLine);
    // Every partition held before the first message (members start from `next`).
    const held = new Set<string>();
    const allHeld = new Promise<void>((resolve) => {
      onHeld = (partition) => {
        held.add(partition);
        if (held.size === partitions.length) resolve();
      };
    });
    const members = [start(0), start(1)];
    await Promise.all(members.map((m) => m.ready));
    await allHeld;

    const sent = new Map<string, Sent>();
    let publishing = true;
    const publisher = (async () => {
      for (let round = 0; round < 12; round++)
        await publishLedger(client(), partitions, 1 + round * 50, 50, sent);
      publishing = false;
    })();

    // The nemesis: SIGKILL a member at a random moment (its restore, a commit, idle), restart it on its store.
    let kills = 0;
    let lostStores = 0;
    while (publishing || kills < 12) {
      await new Promise((resolve) => setTimeout(resolve, 300 + Math.random() * 900));
      const i = Math.floor(Math.random() * 2);
      const victim = members[i]!;
      victim.child.kill('SIGKILL');
      const [, signal] = await victim.exited;
      expect(signal).toBe('SIGKILL');
      kills++;
      // Every fourth kill also loses the member's store (a new machine): it has only the changelog.
      if (kills % 4 === 0) {
        stores[i] = await tempDir();
        lostStores++;
      }
      members[i] = start(i);
    }
    await publisher;
    await Promise.all(members.map((m) => m.ready));

    // Every partition, in whichever member holds it, up to the last offset sent.
    const targets = Object.fromEntries([...sent].map(([p, s]) => [p, String(s.lastOffset)]));
    const all = new Promise<void>((resolve) => {
      onReached = () => {
        if (reached.size === partitions.length) resolve();
      };
    });
    for (const m of members) m.send({ wait: targets });
    await all;

    const assigned = lines.filter((l) => l.kind === 'assigned').length;
    console.log(
      `[group crash] kills=${kills} (${lostStores} with the store lost) assignments=${assigned} messages=${[
        ...sent.values(),
      ]
        .map((s) => s.lastOffset + 1n)
        .join('/')} ` +
        [...reached.values()]
          .map((r) => `${r.reached.slice(name.length)}@${r.member}: ${r.balance}/${r.count}`)
          .join(' '),
    );
    expect(failures).toEqual([]);
    expect(kills).toBeGreaterThanOrEqual(10);
    // Partitions moved: more assignments than one per partition.
    expect(assigned).toBeGreaterThan(partitions.length * 3);
    for (const [partition, s] of sent) {
      const r = reached.get(partition)!;
      expect({ partition, balance: r.balance, count: r.count, doubles: r.doubles }).toEqual({
        partition,
        balance: s.balance,
        count: s.distinct,
        doubles: null,
      });
    }
    for (const m of members) m.child.kill('SIGTERM');
    const exits = await Promise.all(members.map((m) => m.exited));
    expect(exits.map(([code]) => code)).toEqual([0, 0]);
  });
});
