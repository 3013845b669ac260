import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

// Cuts one process's TCP connections to the broker, and only its, on this machine: the process
// runs with its own group id (test/fixtures/group-member.ts, SOCKET_GID), an nftables rule in the
// output hook marks each connection it opens to `ports` (conntrack mark), and a cut drops or
// rejects every packet of a marked connection, both ways (on loopback each side's packets pass the
// output hook). The process is not stopped: it goes on with what it already received.
const run = promisify(execFile);
const nft = (command: string): Promise<unknown> =>
  run('nft', [command]).catch((err: unknown) => {
    throw new Error(`nft ${command} failed (this test needs root and nftables: apt-get install nftables)`, {
      cause: err,
    });
  });

/** One table per group id, and the connections of group id N marked N: each member's cut is its own. */
const tableOf = (gid: number): string => `inet stream_dedup_socket_cut_${gid}`;

export type CutKind = 'drop' | 'reset';

export class SocketCut {
  readonly gid: number;
  readonly #table: string;
  readonly #ports: readonly number[];
  #cut: CutKind | undefined;

  private constructor(gid: number, ports: readonly number[]) {
    this.gid = gid;
    this.#table = tableOf(gid);
    this.#ports = ports;
  }

  /**
   * Marks, from now on, every connection a process of group `gid` opens to one of `ports` (on
   * 127.0.0.1). Needs root and nft: fails loudly without them.
   */
  static async install(gid: number, ports: readonly number[]): Promise<SocketCut> {
    const table = tableOf(gid);
    await nft(`delete table ${table}`).catch(() => undefined);
    await nft(`add table ${table}`);
    await nft(`add chain ${table} cut`);
    await nft(`add chain ${table} out { type filter hook output priority 0 ; policy accept ; }`);
    await nft(
      `add rule ${table} out meta skgid ${gid} ip daddr 127.0.0.1 tcp dport { ${ports.join(', ')} } ct state new ct mark set ${gid}`,
    );
    await nft(`add rule ${table} out ct mark ${gid} jump cut`);
    return new SocketCut(gid, ports);
  }

  /**
   * `drop`: every packet of the marked connections to `ports` (default: all marked ports), new
   * connections included, is dropped silently: both ends see nothing until their own time-outs
   * (heartbeats, a confirm that does not come); connections to the other ports go on.
   * `reset`: the marked connections still open are destroyed on both ends (`ss -K`: the broker
   * sees its socket closed at once, the process a reset), and every later packet of a marked
   * connection is refused with a TCP reset: the process's new connections fail at once.
   * `pid` is the process's, for `reset`.
   */
  async cut(kind: CutKind, pid: number, ports: readonly number[] = this.#ports): Promise<void> {
    if (this.#cut !== undefined) throw new Error(`already cut (${this.#cut})`);
    this.#cut = kind;
    const set = `{ ${ports.join(', ')} }`;
    if (kind === 'drop') {
      await nft(`add rule ${this.#table} cut tcp dport ${set} counter drop`);
      await nft(`add rule ${this.#table} cut tcp sport ${set} counter drop`);
      return;
    }
    await nft(`add rule ${this.#table} cut counter reject with tcp reset`);
    for (const port of await this.#localPorts(pid)) {
      await run('ss', ['-K', '-tnH', 'state', 'established', `( sport = :${port} or dport = :${port} )`]);
    }
  }

  /** The local ports of `pid`'s established TCP connections to a marked port (`ss -tnp`). */
  async #localPorts(pid: number): Promise<number[]> {
    const { stdout } = await run('ss', ['-tnpH', 'state', 'established']);
    const ports: number[] = [];
    for (const line of stdout.split('\n')) {
      if (!line.includes(`pid=${pid},`)) continue;
      const pair = /127\.0\.0\.1:(\d+)\s+127\.0\.0\.1:(\d+)/.exec(line);
      if (pair !== null && this.#ports.includes(Number(pair[2]))) ports.push(Number(pair[1]));
    }
    return ports;
  }

  /** Ends the cut; returns the packets it dropped or refused. */
  async heal(): Promise<number> {
    const { stdout } = (await run('nft', [`list chain ${this.#table} cut`])) as { stdout: string };
    const packets = [...stdout.matchAll(/counter packets (\d+)/g)].reduce((n, m) => n + Number(m[1]), 0);
    await nft(`flush chain ${this.#table} cut`);
    this.#cut = undefined;
    return packets;
  }

  /** Removes the rules (after the file's tests). */
  async remove(): Promise<void> {
    await nft(`delete table ${this.#table}`).catch(() => undefined);
  }
}
