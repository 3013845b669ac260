import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { identityHeaders } from '../../src/identity/headers.js';
import { SuperStreamDedupPublisher } from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { runCliOnBroker, type CliRun } from '../support/cli.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();
const superStream = useSuperStreams(client);
const createdStreams: string[] = [];

afterAll(async () => {
  for (const stream of createdStreams)
    await client()
      .deleteStream({ stream })
      .catch(() => undefined);
});

const cli = runCliOnBroker;

/** A one-line error, as the CLI prints for the failures users meet: no stack trace. */
function expectOneErrorLine(run: CliRun, pattern: RegExp): void {
  expect(run.stderr.trimEnd().split('\n')).toHaveLength(1);
  expect(run.stderr).toMatch(pattern);
  expect(run.stderr).not.toMatch(/^\s+at /m);
}

/** One message stamped by hand into a partition through an unnamed publisher (no broker dedup). */
async function rawWrite(stream: string, producerName: string, publishingId: bigint): Promise<void> {
  const publisher = await client().declarePublisher({ stream });
  const confirmed = new Promise<void>((resolve) => publisher.on('publish_confirm', () => resolve()));
  await publisher.send(Buffer.from('planted'), {
    applicationProperties: identityHeaders(producerName, publishingId),
  });
  await publisher.flush();
  await confirmed;
  await publisher.close();
}

interface PartitionJson {
  stream: string;
  messages: number;
  ok: boolean;
  producers: Array<{ producerName: string; messages: number; firstId: string; lastId: string }>;
}

describe('cli - audit and inspect a super stream', () => {
  it('audits every partition and sums (exit 0); a gap planted in one partition fails it, naming that partition; inspect shows the three partitions', async () => {
    const name = await superStream('cli-ss');
    const partitions = [0, 1, 2].map((i) => `${name}-${i}`);
    const store = join(await tempDir(), 'store');
    const producerName = 'cli-ss-producer';
    const pub = await SuperStreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      superStream: name,
      producerName,
      store,
      routing: { kind: 'hash', key: (body) => Buffer.from(body).toString() },
    });
    expect(pub.partitions).toEqual(partitions);
    await Promise.all(Array.from({ length: 300 }, (_, i) => pub.send(Buffer.from(`order-${i}`))));
    const last = pub.lastPublishingIds;
    await pub.close();
    // Hash routing spreads 300 keys over all three: every partition has IDs 1..n of its own.
    for (const p of partitions) expect(last.get(p)).toBeGreaterThan(0n);
    expect([...last.values()].reduce((s, n) => s + n, 0n)).toBe(300n);

    const clean = await cli(['audit', name]);
    expect(clean.stderr).toBe('');
    expect(clean.code).toBe(0);
    expect(clean.stdout).toContain(
      `super stream "${name}": 3 partitions, 300 messages, 1 producer, 0 without identity`,
    );
    for (const p of partitions) {
      const n = last.get(p)!;
      expect(clean.stdout).toMatch(new RegExp(`^${p} +${n} +1 +0 +0 +0 +0 +0 +0 +ok$`, 'm'));
      expect(clean.stdout).toMatch(new RegExp(`^${p} +${producerName} +${n} +1 +${n} +0 +0 +0 +0 +0$`, 'm'));
    }
    expect(clean.stdout).toMatch(/^total +300 +1 +0 +0 +0 +0 +0 +0 +ok$/m);
    expect(clean.stdout).toContain('audit: OK in all 3 partitions');

    const cleanJson = await cli(['audit', name, '--json']);
    expect(cleanJson.code).toBe(0);
    const sums = JSON.parse(cleanJson.stdout) as Record<string, unknown> & { partitions: PartitionJson[] };
    expect(sums).toMatchObject({ superStream: name, messages: 300, gaps: 0, ok: true, failedPartitions: [] });
    expect(sums.partitions.map((p) => [p.stream, p.messages, p.ok])).toEqual(
      partitions.map((p) => [p, Number(last.get(p)), true]),
    );

    // The next ID of partition 1 never arrives: its producer jumps from n to n + 2.
    const holed = partitions[1]!;
    const n = last.get(holed)!;
    await rawWrite(holed, producerName, n + 2n);
    const dirty = await cli(['audit', name]);
    expect(dirty.stderr).toBe('');
    expect(dirty.code).toBe(1);
    expect(dirty.stdout).toMatch(new RegExp(`^${holed} +${n + 1n} +1 +0 +0 +1 +1 +0 +0 +FAILED$`, 'm'));
    expect(dirty.stdout).toContain(`${holed}: ${producerName}: 1 missing id in 1 gap: ${n + 1n}`);
    expect(dirty.stdout).toContain(
      `audit: FAILED in 1 of 3 partitions (${holed}) — 0 duplicates, 1 missing id`,
    );
    const dirtyJson = await cli(['audit', name, '--json']);
    expect(dirtyJson.code).toBe(1);
    expect(JSON.parse(dirtyJson.stdout)).toMatchObject({
      messages: 301,
      missingIds: '1',
      gaps: 1,
      ok: false,
      failedPartitions: [holed],
    });
    // The partition alone is a stream: audited as before, with the same finding.
    const alone = await cli(['audit', holed, '--json']);
    expect(alone.code).toBe(1);
    expect(JSON.parse(alone.stdout)).toMatchObject({ stream: holed, missingIds: '1', gaps: 1 });

    const inspected = await cli(['inspect', store, '--json']);
    expect(inspected.stderr).toBe('');
    expect(inspected.code).toBe(0);
    const json = JSON.parse(inspected.stdout) as Record<string, unknown>;
    expect(json).toMatchObject({
      producers: [],
      superStreams: [
        {
          superStream: name,
          producerName,
          partitions: partitions.map((partition) => ({
            partition,
            state: {
              target: partition,
              producerName,
              idMode: 'auto',
              lastId: String(last.get(partition)),
              outboxMessages: 0,
            },
          })),
        },
      ],
    });
    const human = await cli(['inspect', store]);
    expect(human.code).toBe(0);
    expect(human.stdout).toContain('super stream producers: 1');
    for (const p of partitions) {
      expect(human.stdout).toMatch(
        new RegExp(`^${name} +${producerName} +${p} +auto +${last.get(p)} +0 +0 +-$`, 'm'),
      );
    }
    const filtered = await cli(['inspect', store, '--producer', producerName, '--json']);
    expect(filtered.code).toBe(0);
    expect(JSON.parse(filtered.stdout)).toMatchObject({ superStreams: [{ producerName }] });
  });

  it('a name that is both a stream and a super stream needs --stream or --super-stream (exit 2)', async () => {
    const name = await superStream('cli-ss-both');
    await client().createStream({ stream: name, arguments: {} });
    createdStreams.push(name);
    const ambiguous = await cli(['audit', name]);
    expect(ambiguous.code).toBe(2);
    expect(ambiguous.stdout).toBe('');
    expectOneErrorLine(ambiguous, /is both a stream and a super stream .*pass --stream or --super-stream/);
    const [asStream, asSuper, both] = await Promise.all([
      cli(['audit', name, '--stream', '--json']),
      cli(['audit', name, '--super-stream', '--json']),
      cli(['audit', name, '--stream', '--super-stream']),
    ]);
    expect(asStream.code).toBe(0);
    expect(JSON.parse(asStream.stdout)).toMatchObject({ stream: name, messages: 0, ok: true });
    expect(asSuper.code).toBe(0);
    expect(JSON.parse(asSuper.stdout)).toMatchObject({ superStream: name, messages: 0, ok: true });
    expect(both.code).toBe(2);
  });

  it('bad input: --super-stream on a name that is none is exit 3; inspect --producer of a name the store lacks is exit 4', async () => {
    const missing = uniqueName('cli-ss-none');
    const run = await cli(['audit', missing, '--super-stream']);
    expect(run.code).toBe(3);
    expect(run.stdout).toBe('');
    expectOneErrorLine(
      run,
      new RegExp(`^error: DEDUP_BROKER_REFUSED: super stream "${missing}" does not exist`),
    );
    const auto = await cli(['audit', missing]);
    expect(auto.code).toBe(3);
    expectOneErrorLine(auto, /it does not exist, and no super stream of that name exists either/);

    const name = await superStream('cli-ss-store');
    const store = join(await tempDir(), 'store');
    const pub = await SuperStreamDedupPublisher.open({
      connection: STREAM_CONNECTION,
      superStream: name,
      producerName: 'present',
      store,
      routing: { kind: 'hash', key: (body) => Buffer.from(body).toString() },
    });
    await pub.close();
    const absent = await cli(['inspect', store, '--producer', 'absent']);
    expect(absent.code).toBe(4);
    expect(absent.stdout).toBe('');
    expectOneErrorLine(absent, /^error: store .* has no producer named "absent" .*it has "present"\)$/m);
    // Opened, never sent to: the record lists the partitions, none has state yet.
    const present = await cli(['inspect', store, '--producer', 'present']);
    expect(present.code).toBe(0);
    expect(present.stdout).toMatch(new RegExp(`^${name} +present +${name}-2 +- +- +- +- +-$`, 'm'));
  });
});
