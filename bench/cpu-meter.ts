/**
 * CPU seconds spent by each process of a benchmark over a window: this Node.js process, the broker
 * (every `beam.smp` on the machine) and PostgreSQL (every `postgres` process, plus what the
 * postmaster's reaped backends spent). Read from /proc (Linux), so a case's cost per row can be
 * added up across the three servers that share the machine's cores (issue 35's bound: a relay
 * costs at least the raw publish plus PostgreSQL's read and delete of its rows).
 */
import { readdirSync, readFileSync } from 'node:fs';

/** CPU seconds by process, over a window or since boot. */
export interface CpuSeconds {
  readonly node: number;
  readonly broker: number;
  readonly postgres: number;
}

const TICKS_PER_SECOND = 100;

/** utime + stime (and the reaped children's, when asked) of one /proc stat line, in ticks. */
function ticksOf(stat: string, withChildren: boolean): { comm: string; ppid: number; ticks: number } {
  const close = stat.lastIndexOf(')');
  const comm = stat.slice(stat.indexOf('(') + 1, close);
  // Fields after the command: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
  const f = stat.slice(close + 2).split(' ');
  const own = Number(f[11]) + Number(f[12]);
  return { comm, ppid: Number(f[1]), ticks: withChildren ? own + Number(f[13]) + Number(f[14]) : own };
}

function serverTicks(): { broker: number; postgres: number } {
  const procs: { pid: number; comm: string; ppid: number; own: number; all: number }[] = [];
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid <= 0) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    } catch {
      continue; // exited meanwhile
    }
    const own = ticksOf(stat, false);
    if (own.comm !== 'beam.smp' && own.comm !== 'postgres') continue;
    procs.push({ pid, comm: own.comm, ppid: own.ppid, own: own.ticks, all: ticksOf(stat, true).ticks });
  }
  const postgresPids = new Set(procs.filter((p) => p.comm === 'postgres').map((p) => p.pid));
  let broker = 0;
  let postgres = 0;
  for (const p of procs) {
    if (p.comm === 'beam.smp') broker += p.own;
    // The postmaster (its parent is not a postgres process) also counts its exited backends.
    else postgres += postgresPids.has(p.ppid) ? p.own : p.all;
  }
  return { broker: broker / TICKS_PER_SECOND, postgres: postgres / TICKS_PER_SECOND };
}

/** CPU seconds of each process so far. */
export function cpuNow(): CpuSeconds {
  const { user, system } = process.cpuUsage();
  return { node: (user + system) / 1e6, ...serverTicks() };
}

/** A window over which {@link cpuNow} is taken twice; `spent` is the difference once stopped. */
export class CpuWindow {
  #from: CpuSeconds | undefined;
  #spent: CpuSeconds | undefined;
  #wallMs = 0;
  #startedAt = 0;

  start(): void {
    this.#from = cpuNow();
    this.#startedAt = performance.now();
  }

  stop(): void {
    const to = cpuNow();
    const from = this.#from;
    if (from === undefined) throw new Error('CpuWindow.stop() before start()');
    this.#wallMs = performance.now() - this.#startedAt;
    this.#spent = {
      node: to.node - from.node,
      broker: to.broker - from.broker,
      postgres: to.postgres - from.postgres,
    };
  }

  /** CPU seconds by process over the window. */
  get spent(): CpuSeconds {
    if (this.#spent === undefined) throw new Error('CpuWindow read before stop()');
    return this.#spent;
  }

  /** The window's length in seconds. */
  get wallSeconds(): number {
    return this.#wallMs / 1000;
  }

  /** All three processes' CPU seconds. */
  get total(): number {
    const s = this.spent;
    return s.node + s.broker + s.postgres;
  }
}
