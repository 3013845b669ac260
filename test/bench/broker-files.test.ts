// The benchmarks' bytes-on-disk rows (issue 37, bench37): they read a stopped broker's folder
// (trixie's, leftovers of the morning) while the live node ran in forky's chroot, and matched a
// changelog `p.g.changelog` as `__p.g.changelog_` where the broker writes `__p_g_changelog_<ts>`:
// the row said "undefined" for a whole session. The folder is now the live node's (its pid file),
// names are mapped as the broker maps them, and what cannot be found throws.
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  BrokerFilesError,
  brokerFolderText,
  brokerStreamsDir,
  isStreamFolder,
  streamDisk,
} from '../../bench/broker-files.js';

describe('isStreamFolder', () => {
  it('matches the broker folder of a changelog whose name holds dots', () => {
    // Seen on RabbitMQ 4.3.6: `b37-a.b.changelog-5248` → `__b37-a_b_changelog-5248_1796354093403644051`.
    expect(isStreamFolder('__b37-a_b_changelog-5248_1796354093403644051', 'b37-a.b.changelog-5248')).toBe(
      true,
    );
    // Seen: `b37-x+z=w-5285` → `__b37-x_z=w-5285_…` (`=` kept, `+` mapped).
    expect(isStreamFolder('__b37-x_z=w-5285_1796354094665594933', 'b37-x+z=w-5285')).toBe(true);
  });

  it('does not take a longer name, another vhost or a folder without a timestamp', () => {
    expect(isStreamFolder('__a_1_123', 'a')).toBe(false);
    expect(isStreamFolder('__a_123', 'a')).toBe(true);
    expect(isStreamFolder('v_a_123', 'a')).toBe(false);
    expect(isStreamFolder('v_a_123', 'a', 'v')).toBe(true);
    expect(isStreamFolder('__a_', 'a')).toBe(false);
    expect(isStreamFolder('__a_12x', 'a')).toBe(false);
  });

  it('maps every UTF-8 byte outside base64url to one _, CR LF to one', () => {
    expect(brokerFolderText('é')).toBe('__');
    expect(brokerFolderText('a\r\nb\rc\n')).toBe('a_b_c_');
    expect(brokerFolderText('A-z_0=9/.+ ')).toBe('A-z_0=9____');
  });
});

describe('brokerStreamsDir', () => {
  let cache: string;
  beforeEach(async () => {
    cache = await mkdtemp(path.join(tmpdir(), 'broker-files-'));
  });
  afterEach(async () => {
    await rm(cache, { recursive: true, force: true });
  });

  async function node(suite: string, pid: number | undefined, withStreams = true): Promise<string> {
    const dir = path.join(cache, suite, 'var/lib/stream-dedup/rabbit');
    const streams = path.join(dir, 'mnesia/rabbit@localhost/stream');
    await mkdir(withStreams ? streams : dir, { recursive: true });
    if (pid !== undefined) await writeFile(path.join(dir, 'pid'), `${pid}\n`);
    return streams;
  }

  it("takes the line whose node runs, not a stopped line's leftovers", async () => {
    await node('trixie', undefined);
    const live = await node('forky', process.pid);
    expect(await brokerStreamsDir({ STREAM_DEDUP_CACHE: cache })).toBe(live);
    await rm(path.join(cache, 'forky'), { recursive: true });
    const trixie = await node('trixie', process.pid);
    expect(await brokerStreamsDir({ STREAM_DEDUP_CACHE: cache })).toBe(trixie);
  });

  it('throws, naming the override, when no node runs or its folder is missing', async () => {
    await node('forky', 2 ** 22 + 12_345); // above the kernel's largest pid (2^22): no such process
    await node('trixie', undefined);
    const error = await brokerStreamsDir({ STREAM_DEDUP_CACHE: cache }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BrokerFilesError);
    expect((error as Error).message).toMatch(/STREAM_DEDUP_BROKER_STREAMS/);
    expect((error as Error).message).toMatch(/forky.*no running node/);
    await rm(path.join(cache, 'forky'), { recursive: true });
    await node('forky', process.pid, false);
    await expect(brokerStreamsDir({ STREAM_DEDUP_CACHE: cache, RABBITMQ_LINE: '4.3' })).rejects.toThrow(
      /runs but this folder is missing/,
    );
  });

  it('takes STREAM_DEDUP_BROKER_STREAMS when it is a folder, off as no disk rows', async () => {
    expect(await brokerStreamsDir({ STREAM_DEDUP_BROKER_STREAMS: cache })).toBe(cache);
    expect(await brokerStreamsDir({ STREAM_DEDUP_BROKER_STREAMS: 'off' })).toBeUndefined();
    await expect(
      brokerStreamsDir({ STREAM_DEDUP_BROKER_STREAMS: path.join(cache, 'nothing') }),
    ).rejects.toBeInstanceOf(BrokerFilesError);
    await expect(brokerStreamsDir({ STREAM_DEDUP_CACHE: cache, RABBITMQ_LINE: '3.13' })).rejects.toThrow(
      /known lines/,
    );
  });

  it("sums the stream's files, and throws when its folder is not exactly one", async () => {
    const folder = path.join(cache, '__p_g_changelog_17');
    await mkdir(folder);
    await writeFile(path.join(folder, '00000000000000000000.segment'), Buffer.alloc(1_000));
    await writeFile(path.join(folder, '00000000000000000000.index'), Buffer.alloc(24));
    await mkdir(path.join(cache, '__p_g_changelog_x_18'));
    const disk = await streamDisk(cache, 'p.g.changelog');
    expect(disk).toMatchObject({ folder, bytes: 1_024, files: 2 });
    await expect(streamDisk(cache, 'q')).rejects.toThrow(/0 folders of stream "q"/);
    await mkdir(path.join(cache, '__p_g_changelog_19'));
    await expect(streamDisk(cache, 'p.g.changelog')).rejects.toThrow(/2 folders/);
  });
});
