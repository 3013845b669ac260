/**
 * The changelog snapshot and retention rows of `bench:verify` (issue 37; docs/design.md §12.1,
 * §12.2), also alone: `STREAM_DEDUP_BENCH_ONLY=snapshot npm run bench:verify`.
 *
 * - Take-over with an empty store, state of 10 000 keys, histories of STREAM_DEDUP_BENCH_SNAPSHOT_HISTORIES
 *   entries (default 10000,100000; add 1000000 for the issue's largest: 4 minutes more at load 13 on
 *   2 shared cores, of which 3 × 52–61 s reading the whole changelog; `none`: no restore rows): the
 *   whole changelog against the snapshot restore, 3 runs each (bench/snapshot-restore.ts).
 * - Changelog disk after STREAM_DEDUP_BENCH_RETENTION_ENTRIES entries (default 1 000 000, about 1 min;
 *   0: no disk row) with `changelogRetention: { maxLengthBytes }` of STREAM_DEDUP_BENCH_RETENTION_BYTES
 *   (default 64 MiB), read in the live broker's folder (bench/broker-files.ts).
 * - The group's throughput with a snapshot every STREAM_DEDUP_BENCH_SNAPSHOT_EVERY entries (default
 *   5: a read of 300 000 messages writes 50–70 entries a partition, 23–24 snapshots a read; 20: 5;
 *   50: 2; 10000, the library's default: none) against snapshots off, both against the raw super
 *   stream consumer in the same rounds (bench/group.ts); off and on alternate which reads first;
 *   STREAM_DEDUP_BENCH_GROUP_ROUNDS rounds (default 3; 0: no group row) when run alone. Each
 *   snapshot's write time (the library's log line) is printed: a partition's commit path waits for
 *   it, a read's first one opening the snapshot appender (~300 ms against ~140 ms later, load 3–7),
 *   so in a 1–3 s read even 2 snapshots cost more than 5 %.
 */
import { loadavg } from 'node:os';
import { median } from './common.js';
import { measureGroup, type GroupRates } from './group.js';
import {
  measureRetentionDisk,
  measureSnapshotRestore,
  type RetentionDisk,
  type SnapshotRestoreTimes,
} from './snapshot-restore.js';

const HISTORIES_SET = process.env.STREAM_DEDUP_BENCH_SNAPSHOT_HISTORIES ?? '10000,100000';
const HISTORIES = HISTORIES_SET === 'none' ? [] : HISTORIES_SET.split(',').map(Number);
const RETENTION_ENTRIES = Number(process.env.STREAM_DEDUP_BENCH_RETENTION_ENTRIES ?? 1_000_000);
const RETENTION_BYTES = Number(process.env.STREAM_DEDUP_BENCH_RETENTION_BYTES ?? 64 * 1024 * 1024);
/** Snapshots every this many entries in the group's throughput rows. */
export const SNAPSHOT_EVERY = Number(process.env.STREAM_DEDUP_BENCH_SNAPSHOT_EVERY ?? 5);
const RUNS = 3;
const GROUP_ROUNDS = Number(process.env.STREAM_DEDUP_BENCH_GROUP_ROUNDS ?? RUNS);
/** Fewer snapshots than this in a read and the on/off row measures too little to say anything. */
const ENOUGH_SNAPSHOTS = 10;

export interface SnapshotRows {
  readonly json: Record<string, unknown>;
  readonly targets: Record<string, { target: number; got: number; at?: string }>;
  readonly met: Record<string, boolean>;
}

const load = (): string =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
const ms = (xs: readonly number[]): string => xs.map((x) => Math.round(x).toLocaleString('en')).join(' / ');

/**
 * Measures the snapshot rows and prints them; `group` is the group measurement of the same run when
 * it had snapshot rounds (bench:verify's), else one is made here (3 rounds).
 */
export async function snapshotRows(group?: GroupRates): Promise<SnapshotRows> {
  const began = performance.now();
  const restores: SnapshotRestoreTimes[] = [];
  const loads: Record<string, string> = {};
  const seconds: Record<string, number> = {};
  for (const history of HISTORIES) {
    loads[`restore ${history}`] = load();
    const started = performance.now();
    restores.push(await measureSnapshotRestore(history, RUNS));
    seconds[`restore ${history}`] = Math.round((performance.now() - started) / 1000);
  }
  let disk: RetentionDisk | undefined;
  if (RETENTION_ENTRIES > 0) {
    loads.retention = load();
    const startedDisk = performance.now();
    disk = await measureRetentionDisk(RETENTION_ENTRIES, RETENTION_BYTES);
    seconds.retention = Math.round((performance.now() - startedDisk) / 1000);
  }
  let rates = group?.snapshots === undefined ? undefined : group;
  if (rates === undefined && GROUP_ROUNDS > 0) {
    loads.group = load();
    const startedGroup = performance.now();
    rates = await measureGroup(300_000, GROUP_ROUNDS, SNAPSHOT_EVERY);
    seconds.group = Math.round((performance.now() - startedGroup) / 1000);
  }

  console.log(
    `snapshots and retention (issue 37), load ${Object.entries(loads)
      .map(([k, v]) => `${k}: ${v}`)
      .join('; ')}`,
  );
  for (const r of restores) {
    console.log(
      `${`take-over, ${r.history.toLocaleString('en')} entries`.padEnd(30)} whole changelog ${ms(r.wholeMs)} ms; from the snapshot ${ms(r.snapshotMs)} ms (${r.appliedAfter} entries after it; written in ${Math.round(r.writeMs)} ms, ${r.snapshotBytes.toLocaleString('en')} B); ${(median(r.wholeMs) / median(r.snapshotMs)).toFixed(1)}× faster`,
    );
  }
  const mib = (b: number): string => `${(b / 1024 / 1024).toFixed(1)} MiB`;
  if (disk !== undefined)
    console.log(
      `${'changelog with retention'.padEnd(30)} ${disk.entries.toLocaleString('en')} entries and ${disk.snapshots} snapshots appended (${mib(disk.appendedBytes)}), maxLengthBytes ${mib(disk.maxLengthBytes)} (segments ${mib(disk.segmentBytes)}): ${disk.diskBytes === undefined ? 'disk row off (STREAM_DEDUP_BROKER_STREAMS=off)' : `${disk.diskBytes.toLocaleString('en')} B on the broker's disk in ${disk.diskFiles} files (${(disk.diskBytes / disk.maxLengthBytes).toFixed(3)}× the setting; ${disk.diskAllocatedBytes!.toLocaleString('en')} B allocated)`}; first offset ${disk.firstOffset.toLocaleString('en')} of ${disk.lastOffset.toLocaleString('en')}; take-over from the kept snapshot ${Math.round(disk.restoreMs)} ms (${disk.restoreApplied.toLocaleString('en')} entries after it); filled in ${Math.round(disk.fillMs / 1000)} s`,
    );
  const snapshots = rates?.snapshots;
  // Each round's on ÷ off (the two reads ran back to back): drift between rounds cancels.
  const perRound = snapshots?.rounds.on.map((on, i) => on / snapshots.rounds.off[i]!) ?? [];
  const onToOff = perRound.length === 0 ? undefined : median(perRound);
  if (rates !== undefined && snapshots !== undefined && onToOff !== undefined) {
    const f = (xs: readonly number[]): string => xs.map((l) => l.toFixed(1)).join(' ');
    console.log(
      `${'group, snapshots off'.padEnd(30)} ${Math.round(snapshots.offPerSec).toLocaleString('en').padStart(9)} msg/s, ${(snapshots.offPerSec / rates.rawPerSec).toFixed(3)} of raw ${Math.round(rates.rawPerSec).toLocaleString('en')} (rounds ${snapshots.rounds.off.map(Math.round).join(' ')})`,
    );
    console.log(
      `${`group, snapshot every ${snapshots.every}`.padEnd(30)} ${Math.round(snapshots.onPerSec).toLocaleString('en').padStart(9)} msg/s, ${(snapshots.onPerSec / rates.rawPerSec).toFixed(3)} of raw, ${onToOff.toFixed(3)} of snapshots off (rounds ${snapshots.rounds.on.map(Math.round).join(' ')}; ${snapshots.written.join('/')} snapshots a read)`,
    );
    console.log(
      `${''.padEnd(30)} on ÷ off per round ${perRound.map((r) => r.toFixed(3)).join(' ')} (median ${onToOff.toFixed(3)}; ratio of medians ${(snapshots.onPerSec / snapshots.offPerSec).toFixed(3)}); first ${snapshots.firsts.join(' ')}; changelog messages off ${snapshots.changelog.off.join('/')}, on ${snapshots.changelog.on.join('/')}; load before off ${f(snapshots.loads.off)}, on ${f(snapshots.loads.on)}; CPU µs a message off ${snapshots.cpuUsPerMessage.off.map((c) => c.toFixed(2)).join(' ')}, on ${snapshots.cpuUsPerMessage.on.map((c) => c.toFixed(2)).join(' ')} (medians ${median(snapshots.cpuUsPerMessage.off).toFixed(2)} / ${median(snapshots.cpuUsPerMessage.on).toFixed(2)})`,
    );
    const writes = snapshots.snapshotMs.flat();
    const firstMs = writes.filter((w) => w.first).map((w) => w.ms);
    const laterMs = writes.filter((w) => !w.first).map((w) => w.ms);
    const spread = (xs: readonly number[]): string =>
      xs.length === 0
        ? 'none'
        : `median ${median(xs)} ms (${Math.min(...xs)}–${Math.max(...xs)}, ${xs.length})`;
    console.log(
      `${''.padEnd(30)} snapshot writes (the commit path waits for each): a partition's first in the read ${spread(firstMs)}, later ones ${spread(laterMs)}; per read in all ${snapshots.snapshotMs.map((r) => r.reduce((sum, w) => sum + w.ms, 0)).join(' ')} ms`,
    );
    if (snapshots.written.some((w) => w < ENOUGH_SNAPSHOTS))
      console.log(
        `  (a read wrote fewer than ${ENOUGH_SNAPSHOTS} snapshots: lower STREAM_DEDUP_BENCH_SNAPSHOT_EVERY for a figure that says something)`,
      );
  }
  console.log(
    `snapshot rows took ${Math.round((performance.now() - began) / 1000)} s (${Object.entries(seconds)
      .map(([k, v]) => `${k} ${v} s`)
      .join(', ')})`,
  );

  const medians = restores.map((r) => median(r.snapshotMs));
  const largest = restores.at(-1);
  const targets: SnapshotRows['targets'] = {
    ...(largest === undefined
      ? {}
      : {
          snapshotRestoreFlat: {
            target: 1.5,
            got: Number((Math.max(...medians) / Math.min(...medians)).toFixed(3)),
            at: HISTORIES.join(','),
          },
          snapshotRestoreSpeedup: {
            target: 20,
            got: Number((median(largest.wholeMs) / median(largest.snapshotMs)).toFixed(1)),
            at: String(largest.history),
          },
        }),
    ...(onToOff === undefined
      ? {}
      : {
          snapshotsOnToOff: { target: 0.95, got: Number(onToOff.toFixed(3)), at: `every ${SNAPSHOT_EVERY}` },
        }),
    ...(disk?.diskBytes === undefined
      ? {}
      : {
          retentionDiskToSetting: {
            target: 1,
            got: Number((disk.diskBytes / disk.maxLengthBytes).toFixed(3)),
            at: String(disk.entries),
          },
        }),
  };
  const met: Record<string, boolean> = {
    ...(targets.snapshotRestoreFlat === undefined
      ? {}
      : {
          snapshotRestoreFlat: targets.snapshotRestoreFlat.got <= 1.5,
          // The issue's 20× is at 1 000 000 entries: at a smaller largest history it is context.
          snapshotRestoreSpeedup: targets.snapshotRestoreSpeedup!.got >= 20,
        }),
    ...(onToOff === undefined ? {} : { snapshotsOnToOff: onToOff >= 0.95 }),
    ...(targets.retentionDiskToSetting === undefined
      ? {}
      : { retentionDiskToSetting: targets.retentionDiskToSetting.got <= 1 }),
  };
  for (const [name, ok] of Object.entries(met)) {
    const t = targets[name]!;
    const relation = name === 'snapshotRestoreFlat' || name === 'retentionDiskToSetting' ? '<=' : '>=';
    console.log(
      `target ${name}: ${t.got} (${relation} ${t.target}${t.at === undefined ? '' : `, at ${t.at}`}) ${ok ? 'met' : 'MISSED'}`,
    );
  }
  const json = {
    loads,
    seconds,
    restores: restores.map((r) => ({
      history: r.history,
      wholeMs: r.wholeMs.map(Math.round),
      snapshotMs: r.snapshotMs.map(Math.round),
      writeMs: Math.round(r.writeMs),
      snapshotBytes: r.snapshotBytes,
      appliedAfter: r.appliedAfter,
    })),
    retention:
      disk === undefined
        ? undefined
        : {
            ...disk,
            firstOffset: Number(disk.firstOffset),
            lastOffset: Number(disk.lastOffset),
            restoreMs: Math.round(disk.restoreMs),
            fillMs: Math.round(disk.fillMs),
          },
    group:
      rates === undefined || snapshots === undefined || onToOff === undefined
        ? undefined
        : {
            messages: rates.messages,
            rawPerSec: Math.round(rates.rawPerSec),
            every: snapshots.every,
            offPerSec: Math.round(snapshots.offPerSec),
            onPerSec: Math.round(snapshots.onPerSec),
            onToOff: Number(onToOff.toFixed(3)),
            onToOffPerRound: perRound.map((r) => Number(r.toFixed(3))),
            firsts: snapshots.firsts,
            cpuUsPerMessage: {
              off: snapshots.cpuUsPerMessage.off.map((c) => Number(c.toFixed(2))),
              on: snapshots.cpuUsPerMessage.on.map((c) => Number(c.toFixed(2))),
            },
            changelog: snapshots.changelog,
            loads: {
              off: snapshots.loads.off.map((l) => Number(l.toFixed(2))),
              on: snapshots.loads.on.map((l) => Number(l.toFixed(2))),
            },
            rounds: {
              raw: rates.rounds.raw.map(Math.round),
              off: snapshots.rounds.off.map(Math.round),
              on: snapshots.rounds.on.map(Math.round),
            },
            written: snapshots.written,
            snapshotMs: snapshots.snapshotMs.map((r) => r.map((w) => (w.first ? -w.ms : w.ms))),
            load: snapshots.load.map((l) => Number(l.toFixed(2))),
          },
  };
  return { json, targets, met };
}
