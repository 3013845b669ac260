/**
 * The group row of `bench:verify` at several `appendsInFlight` depths, in one run (issue 39 item 5):
 * a 3-partition super stream read from the first offset by the raw client's super stream consumer
 * and by a group of two members at each depth, interleaved round by round, each read in a fresh
 * process (bench/group.ts). Prints each round and the medians with their ratio to raw.
 *
 *   node --import tsx bench/group-depths.ts [messages=300000] [rounds=3] [depths=1,2,4,8]
 *
 * Needs `npm run build` first (the members are the built package's).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { connectClient, measureInChild, median, uniqueName } from './common.js';
import { fill, PARTITIONS } from './group.js';

const count = Number(process.argv[2] ?? 300_000);
const rounds = Number(process.argv[3] ?? 3);
const depths = (process.argv[4] ?? '1,2,4,8').split(',').map(Number);
const perPartition = Math.ceil(count / PARTITIONS);
const dir = await mkdtemp(join(tmpdir(), 'bench-group-depths-'));
const superStream = uniqueName('bench-group-depths');
const client = await connectClient();
const groupScript = new URL('./group.ts', import.meta.url).href;
const run = (
  mode: string,
  round: string,
  depth?: number,
): Promise<{ rate: number; cpuShare: number; cpuUsPerMessage: number }> =>
  measureInChild(groupScript, [mode, superStream, dir, String(perPartition), round], {
    STREAM_DEDUP_BENCH_GROUP: '1',
    ...(depth === undefined ? {} : { STREAM_DEDUP_BENCH_APPENDS: String(depth) }),
  });
try {
  await client.createSuperStream({ streamName: superStream, arguments: {} }, undefined, PARTITIONS);
  await fill(await client.queryPartitions({ superStream }), dir, perPartition);
  const raw: number[] = [];
  const group = new Map<number, number[]>(depths.map((d) => [d, []]));
  for (let i = 0; i < rounds; i++) {
    const load = loadavg()[0]!.toFixed(2);
    const r = await run('raw', String(i));
    raw.push(r.rate);
    // CPU time of the reading process over the read's wall time: near 1, one core's worth (bound by it).
    const cpu = [`raw cpu ${r.cpuShare.toFixed(2)} (${r.cpuUsPerMessage.toFixed(1)} µs/msg)`];
    for (const d of depths) {
      const g = await run('group', `${i}-${d}`, d);
      group.get(d)!.push(g.rate);
      cpu.push(`${d}: cpu ${g.cpuShare.toFixed(2)} (${g.cpuUsPerMessage.toFixed(1)} µs/msg)`);
    }
    const line = depths.map((d) => `${d}: ${(group.get(d)!.at(-1)! / raw.at(-1)!).toFixed(3)}`).join('  ');
    process.stdout.write(
      `round ${i} (load ${load}): raw ${Math.round(raw.at(-1)!)} msg/s; group/raw ${line}; ${cpu.join(', ')}\n`,
    );
  }
  const rawMedian = median(raw);
  for (const d of depths) {
    const rates = group.get(d)!;
    process.stdout.write(
      `appendsInFlight ${d}: median ${Math.round(median(rates))} msg/s = ${(median(rates) / rawMedian).toFixed(3)} of raw ${Math.round(rawMedian)}; rounds ${rates.map(Math.round).join(' ')}\n`,
    );
  }
} finally {
  await client.deleteSuperStream({ streamName: superStream }).catch(() => undefined);
  await client.close();
  await rm(dir, { recursive: true, force: true });
}
