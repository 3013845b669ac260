import { fork } from 'node:child_process';
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { once } from 'node:events';
import net from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { identityHeaders } from '../../src/identity/headers.js';
import { DedupStore } from '../../src/store/store.js';
import { StreamDedupPublisher, StreamVerifyingConsumer } from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { runCliOnBroker, type CliRun } from '../support/cli.js';
import { useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const holder = fileURLToPath(new URL('../fixtures/hold-store.ts', import.meta.url));
const client = useClient();
const tempDir = useTempDir();

const cli = runCliOnBroker;

/** A one-line error, as the CLI prints for the failures users meet: no stack trace. */
function expectOneErrorLine(run: CliRun, pattern: RegExp): void {
  expect(run.stderr.trimEnd().split('\n')).toHaveLength(1);
  expect(run.stderr).toMatch(pattern);
  expect(run.stderr).not.toMatch(/^\s+at /m);
}

/**
 * Writes through an unnamed publisher (no broker dedup), stamping identities by hand as a buggy
 * or retrying writer would: `[producer, id]`, or `undefined` for a message without identity.
 */
async function rawWrite(stream: string, messages: ReadonlyArray<readonly [string, number] | undefined>) {
  const publisher = await client().declarePublisher({ stream });
  let confirmed = 0;
  const all = new Promise<void>((resolve) =>
    publisher.on('publish_confirm', (_err, ids) => {
      confirmed += ids.length;
      if (confirmed >= messages.length) resolve();
    }),
  );
  for (const m of messages) {
    await publisher.send(Buffer.from('raw'), {
      applicationProperties: m === undefined ? { note: 'no identity' } : identityHeaders(m[0], BigInt(m[1])),
    });
  }
  await publisher.flush();
  await all;
  await publisher.close();
}

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('cli - audit', () => {
  it('a stream written by a dedup publisher is clean (exit 0); a raw duplicate and a skipped id fail it (exit 1)', async () => {
    const stream = uniqueName('cli-audit');
    await client().createStream({ stream, arguments: {} });
    try {
      const store = join(await tempDir(), 'store');
      const pub = await StreamDedupPublisher.open({
        connection: STREAM_CONNECTION,
        stream,
        producerName: 'cli-clean',
        store,
      });
      await Promise.all(Array.from({ length: 25 }, (_, i) => pub.send(Buffer.from(`m-${i}`))));
      await pub.close();

      const clean = await cli(['audit', stream]);
      expect(clean.stderr).toBe(''); // stderr is not a terminal: no progress lines
      expect(clean.code).toBe(0);
      expect(clean.stdout).toContain(`stream "${stream}": 25 messages, 1 producer, 0 without identity`);
      expect(clean.stdout).toMatch(/^cli-clean +25 +1 +25 +0 +0 +0 +0 +0 +0$/m);
      expect(clean.stdout).toContain('audit: OK');

      // Offsets 25…30: ids 1, 2, 2 (a duplicate), 4 (3 skipped), 5, then a message without identity.
      await rawWrite(stream, [
        ['cli-raw', 1],
        ['cli-raw', 2],
        ['cli-raw', 2],
        ['cli-raw', 4],
        ['cli-raw', 5],
        undefined,
      ]);
      const dirty = await cli(['audit', stream, '--json']);
      expect(dirty.stderr).toBe('');
      expect(dirty.code).toBe(1);
      expect(dirty.stdout.trimEnd().split('\n')).toHaveLength(1); // one JSON object
      const report = JSON.parse(dirty.stdout) as Record<string, unknown>;
      expect(report).toMatchObject({
        stream,
        messages: 31,
        duplicates: 1,
        missingIds: '1',
        gaps: 1,
        outOfOrder: 0,
        ok: false,
        unidentified: { count: 1, missing: 1, malformed: 0, samples: [{ offset: '30' }] },
      });
      expect(report.producers).toEqual([
        {
          producerName: 'cli-clean',
          messages: 25,
          distinctIds: 25,
          firstId: '1',
          lastId: '25',
          firstOffset: '0',
          lastOffset: '24',
          duplicates: 0,
          duplicateSamples: [],
          expectedCopies: 0,
          expectedCopySamples: [],
          conflictingCopies: 0,
          conflictingCopySamples: [],
          missingIds: '0',
          gaps: 0,
          gapRanges: [],
          skippedIds: '0',
          skippedRanges: [],
          contradictions: 0,
          contradictionSamples: [],
          outOfOrder: 0,
          outOfOrderSamples: [],
        },
        {
          producerName: 'cli-raw',
          messages: 5,
          distinctIds: 4,
          firstId: '1',
          lastId: '5',
          firstOffset: '25',
          lastOffset: '29',
          duplicates: 1,
          duplicateSamples: [{ publishingId: '2', offset: '27', firstOffset: '26' }],
          expectedCopies: 0,
          expectedCopySamples: [],
          conflictingCopies: 0,
          conflictingCopySamples: [],
          missingIds: '1',
          gaps: 1,
          gapRanges: [{ from: '3', to: '3' }],
          skippedIds: '0',
          skippedRanges: [],
          contradictions: 0,
          contradictionSamples: [],
          outOfOrder: 0,
          outOfOrderSamples: [],
        },
      ]);

      const human = await cli(['audit', stream]);
      expect(human.code).toBe(1);
      expect(human.stdout).toContain('cli-raw: 1 duplicate: id 2 at offset 27 (first at 26)');
      expect(human.stdout).toContain('cli-raw: 1 missing id in 1 gap: 3');
      expect(human.stdout).toContain('audit: FAILED — 1 duplicate, 1 missing id in 1 gap, 0 out of order');
    } finally {
      await client().deleteStream({ stream });
    }
  });

  it('an empty stream is clean at once (exit 0, no messages)', async () => {
    const stream = uniqueName('cli-empty');
    await client().createStream({ stream, arguments: {} });
    try {
      const run = await cli(['audit', stream, '--json']);
      expect(run.code).toBe(0);
      expect(JSON.parse(run.stdout)).toMatchObject({ stream, messages: 0, ok: true });
    } finally {
      await client().deleteStream({ stream });
    }
  });

  it('a missing stream is exit code 3 with one error line', async () => {
    const run = await cli(['audit', uniqueName('cli-no-such-stream'), '--json']);
    expect(run.code).toBe(3);
    expect(run.stdout).toBe('');
    expectOneErrorLine(run, /^error: DEDUP_BROKER_REFUSED: cannot read stream ".*": .*does not exist/);
  });

  it('an unreachable broker is exit code 3 with one error line', async () => {
    const run = await cli(['audit', 'anything'], { RABBITMQ_STREAM_PORT: String(await closedPort()) });
    expect(run.code).toBe(3);
    expectOneErrorLine(run, /^error: DEDUP_BROKER_UNREACHABLE: cannot connect to RabbitMQ's stream port/);
  });
});

describe('cli - demo', () => {
  it('kills on observed progress: every kill lands, the audit is OK, and the demo deletes its stream', async () => {
    const run = await cli(['demo', '--kills', '4', '--per-run', '3000']);
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    // Every run but the last was killed mid-way: four kills in five runs, none finished early.
    expect(run.stdout.match(/killed \(SIGKILL\b/g)).toHaveLength(4);
    expect(run.stdout).toMatch(/demo: 5 runs, 4 kills/);
    expect(run.stdout).toMatch(/audit: OK — 0 lost, 0 duplicated/);
    const stream = /deleted stream "([^"]+)"/.exec(run.stdout)?.[1];
    expect(stream).toBeDefined();
    const [info] = await client().queryMetadata({ streams: [stream!] });
    expect(info?.responseCode).toBe(2); // the stream does not exist
  });
});

describe('cli - usage', () => {
  it('usage errors are exit code 2; help is exit code 0 and names both commands', async () => {
    const usageErrors = [['audit'], ['audit', 's', '--bogus'], ['inspect', 'a', 'b'], ['nonsense'], []];
    const [help, ...runs] = await Promise.all([cli(['help']), ...usageErrors.map((args) => cli(args))]);
    runs.forEach((run, i) => expect(run.code, usageErrors[i]!.join(' ')).toBe(2));
    expect(runs[0]!.stderr).toBe(
      'audit: expects exactly one argument, <stream>\n' +
        'usage: stream-dedup audit <stream> [--json] [--stream | --super-stream] [--from OFFSET | --since TIME]   (stream-dedup help for more)\n',
    );
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('stream-dedup audit <stream> [--json]');
    expect(help.stdout).toContain('stream-dedup inspect <store-folder> [--json]');
  });
});

describe('cli - inspect', () => {
  it('lists the producer, the verifying consumer and its scope of a store used by a publisher and a consumer', async () => {
    const stream = uniqueName('cli-inspect');
    await client().createStream({ stream, arguments: {} });
    const path = join(await tempDir(), 'store');
    const started = Date.now();
    try {
      const store = await DedupStore.open(path);
      const pub = await StreamDedupPublisher.open({
        connection: STREAM_CONNECTION,
        stream,
        producerName: 'cli-inspect-pub',
        store,
      });
      await Promise.all(Array.from({ length: 10 }, (_, i) => pub.send(Buffer.from(`m-${i}`))));
      await pub.close();
      const consumer = await StreamVerifyingConsumer.open({
        connection: STREAM_CONNECTION,
        stream,
        consumerName: 'cli-projection',
        store,
        handler: (message, tx) => tx.put(`seen:${message.identity?.publishingId}`, '1'),
      });
      await consumer.waitForOffset(9n);
      await consumer.close();
      // A producer that died with three messages unconfirmed, as its outbox would hold them.
      const crashed = store.claimProducer('other-stream', 'cli-crashed');
      await crashed.commit({
        meta: { idMode: 'auto', lastId: 3n, reservedUpTo: 0n },
        segment: [1n, 2n, 3n].map((publishingId) => ({
          publishingId,
          body: Buffer.from('x'),
          headers: undefined,
        })),
      });
      crashed.release();
      await store.close();

      const run = await cli(['inspect', path, '--json']);
      expect(run.stderr).toBe('');
      expect(run.code).toBe(0);
      const json = JSON.parse(run.stdout) as {
        scopes: Array<{ lastSeenMs: number; lastSeen: string }>;
      } & Record<string, unknown>;
      expect(json).toMatchObject({
        store: path,
        producers: [
          {
            target: stream,
            producerName: 'cli-inspect-pub',
            idMode: 'auto',
            lastId: '10',
            reservedUpTo: '0',
            outboxMessages: 0,
            outboxSegments: 0,
            outboxFirstId: null,
            outboxLastId: null,
          },
          {
            target: 'other-stream',
            producerName: 'cli-crashed',
            idMode: 'auto',
            lastId: '3',
            outboxMessages: 3,
            outboxSegments: 1,
            outboxFirstId: '1',
            outboxLastId: '3',
          },
        ],
        consumers: [{ consumerName: 'cli-projection', committedOffset: '9' }],
        scopes: [
          {
            consumer: 'cli-projection',
            tenant: '',
            producer: 'cli-inspect-pub',
            policy: { kind: 'window', size: 1024 },
            highest: '10',
          },
        ],
      });
      const [scope] = json.scopes;
      expect(scope!.lastSeenMs).toBeGreaterThanOrEqual(started);
      expect(scope!.lastSeenMs).toBeLessThanOrEqual(Date.now());
      expect(scope!.lastSeen).toBe(new Date(scope!.lastSeenMs).toISOString());

      const human = await cli(['inspect', path]);
      expect(human.code).toBe(0);
      expect(human.stdout).toMatch(new RegExp(`^${stream} +cli-inspect-pub +auto +10 +0 +0 +-$`, 'm'));
      expect(human.stdout).toMatch(/^other-stream +cli-crashed +auto +3 +0 +3 +1\.\.3$/m);
      expect(human.stdout).toMatch(/^cli-projection +9$/m);
      expect(human.stdout).toMatch(
        /^cli-projection +- +cli-inspect-pub +window\(1024\) +10 +\d{4}-\d\d-\d\dT/m,
      );
      expect(human.stdout).toContain('3 messages in the outbox');
    } finally {
      await client().deleteStream({ stream });
    }
  });

  it('a store held by another process is exit code 4 with one line naming DEDUP_STORE_LOCKED', async () => {
    const path = join(await tempDir(), 'store');
    const child = fork(holder, [path], { execArgv: ['--import', 'tsx'], stdio: 'inherit' });
    try {
      const [message] = (await once(child, 'message')) as [string];
      expect(message).toBe('open');
      const locked = await cli(['inspect', path]);
      expect(locked.code).toBe(4);
      expect(locked.stdout).toBe('');
      expectOneErrorLine(locked, /^error: DEDUP_STORE_LOCKED: store .* is locked by another process/);
      child.send('close');
      await once(child, 'exit');
      const free = await cli(['inspect', path]);
      expect(free.code).toBe(0);
      expect(free.stdout).toContain('producers: none');
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('a folder that is not a store is exit code 4, and inspect does not create one', async () => {
    const dir = await tempDir();
    const missing = join(dir, 'no-store-here');
    const run = await cli(['inspect', missing]);
    expect(run.code).toBe(4);
    expectOneErrorLine(run, /^error: no store at .*no-store-here/);
    expect(existsSync(missing)).toBe(false);
    const empty = await cli(['inspect', dir]);
    expect(empty.code).toBe(4);
    expectOneErrorLine(empty, /is not a stream-dedup store/);
    expect(existsSync(join(dir, 'CURRENT'))).toBe(false);
  });

  it('a corrupt store, or an undecodable record in it, is exit code 4 with one DEDUP_STORE_CORRUPT line', async () => {
    const broken = await tempDir();
    await writeFile(join(broken, 'CURRENT'), 'MANIFEST-000099\n');
    const unopenable = await cli(['inspect', broken]);
    expect(unopenable.code).toBe(4);
    expectOneErrorLine(unopenable, /^error: DEDUP_STORE_CORRUPT: store .* cannot be opened/);

    const path = join(await tempDir(), 'store');
    const store = await DedupStore.open(path);
    await store.db.batch([{ type: 'put', key: 'c:4:proj/offset', value: Buffer.from([1, 2, 3]) }]);
    await store.close();
    const undecodable = await cli(['inspect', path, '--json']);
    expect(undecodable.code).toBe(4);
    expect(undecodable.stdout).toBe('');
    expectOneErrorLine(undecodable, /^error: DEDUP_STORE_CORRUPT: store record "c:4:proj\/offset": /);
  });
});
