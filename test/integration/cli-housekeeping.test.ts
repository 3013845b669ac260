import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { StreamDedupPublisher } from '../../src/stream.js';
import { BROKER, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE, runCliOnBroker as cli } from '../support/cli.js';
import { useClient } from '../support/stream.js';
import { useTempDir } from '../support/tmp.js';

const client = useClient();
const tempDir = useTempDir();

/** Whether the broker has a stream of that name. */
async function exists(stream: string): Promise<boolean> {
  const [m] = await client().queryMetadata({ streams: [stream] });
  return m !== undefined && m.responseCode !== 2;
}

/**
 * Runs the CLI on a terminal (util-linux `script` gives it a pseudo-terminal) with `answer` typed in;
 * resolves with what the terminal showed and the exit code. No `script`: the spawn fails loudly.
 */
async function cliOnTerminal(
  args: readonly string[],
  answer: string,
): Promise<{ code: number | null; out: string }> {
  const quote = (a: string): string => `'${a.replaceAll("'", "'\\''")}'`;
  const child = spawn('script', ['-qec', [...CLI_FROM_SOURCE, ...args].map(quote).join(' '), '/dev/null'], {
    env: {
      ...process.env,
      RABBITMQ_HOST: BROKER.host,
      RABBITMQ_STREAM_PORT: String(BROKER.streamPort),
      RABBITMQ_USER: BROKER.username,
      RABBITMQ_PASSWORD: BROKER.password,
    },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
  child.stdin.end(answer);
  const [code] = (await once(child, 'close')) as [number | null];
  return { code, out };
}

// Issue 36, item 6: create, list and delete what the library makes, over the stream protocol only.
describe('cli - create-super-stream, list, delete', () => {
  it('creates a super stream, lists its partitions, a group changelog and a producer, then deletes them all', async () => {
    const name = uniqueName('cli-house');
    const partitions = [0, 1, 2].map((i) => `${name}-${i}`);
    const changelog = `${partitions[0]}.billing.changelog`;
    try {
      const created = await cli(['create-super-stream', name, '--partitions', '3']);
      expect(created).toMatchObject({ code: 0, stderr: '' });
      expect(created.stdout).toBe(
        `created super stream "${name}" with 3 partitions: ${partitions.join(', ')}\n`,
      );
      expect(await client().queryPartitions({ superStream: name })).toEqual(partitions);
      const again = await cli(['create-super-stream', name, '--partitions', '2']);
      expect(again.code).toBe(3);
      expect(again.stderr).toBe(
        `error: DEDUP_BROKER_REFUSED: super stream "${name}" already exists with 3 partitions: ${partitions.join(', ')}\n`,
      );

      // A group's changelog (as SuperStreamVerifyingConsumer names it) and a named producer on partition 0.
      await client().createStream({ stream: changelog, arguments: {} });
      const pub = await StreamDedupPublisher.open({
        connection: STREAM_CONNECTION,
        stream: partitions[0]!,
        producerName: 'house-pub',
        store: join(await tempDir(), 'store'),
      });
      await Promise.all(Array.from({ length: 7 }, (_, i) => pub.send(Buffer.from(`m${i}`))));
      await pub.close();

      const listed = await cli(['list', name, '--group', 'billing', '--producer', 'house-pub', '--json']);
      expect(listed).toMatchObject({ code: 0, stderr: '' });
      const report = JSON.parse(listed.stdout) as {
        superStreams: unknown[];
        streams: Array<Record<string, unknown>>;
        missing: string[];
      };
      expect(report.superStreams).toEqual([{ superStream: name, partitions }]);
      expect(report.missing).toEqual([]);
      expect(report.streams.map((s) => [s.stream, s.kind, s.group])).toEqual([
        [partitions[0], 'partition', null],
        [changelog, 'changelog', 'billing'],
        [partitions[1], 'partition', null],
        [partitions[2], 'partition', null],
      ]);
      expect(report.streams[0]).toMatchObject({
        firstOffset: '0',
        producers: [{ producerName: 'house-pub', lastId: '7' }],
      });
      expect(report.streams[0]!.leader).toMatch(/:\d+$/);
      expect(report.streams[2]).toMatchObject({ firstOffset: null, lastChunkOffset: null, producers: [] });
      const text = await cli(['list', name, '--group', 'billing']);
      expect(text.stdout).toContain(`super stream "${name}": partitions ${partitions.join(', ')}`);
      expect(text.stdout).toMatch(new RegExp(`^${changelog} +changelog of billing `, 'm'));
      const typo = await cli(['list', `${name}-nope`]);
      expect(typo.code).toBe(3);
      expect(typo.stdout).toBe(`"${name}-nope": no stream or super stream of that name\n`);

      const deleted = await cli(['delete', name, '--group', 'billing', '--yes']);
      expect(deleted).toMatchObject({ code: 0, stderr: '' });
      expect(deleted.stdout).toBe(
        `deleted super stream "${name}" with 3 partitions (${partitions.join(', ')}) and 1 changelog (${changelog})\n`,
      );
      for (const s of [...partitions, changelog]) expect(await exists(s), s).toBe(false);
      expect((await cli(['list', name])).code).toBe(3);
      const gone = await cli(['delete', name, '--yes']);
      expect(gone.code).toBe(3);
      expect(gone.stderr).toBe(`error: DEDUP_BROKER_REFUSED: no stream or super stream is named "${name}"\n`);
    } finally {
      await client()
        .deleteSuperStream({ streamName: name })
        .catch(() => undefined);
      await client()
        .deleteStream({ stream: changelog })
        .catch(() => undefined);
    }
  }, 120_000);

  it('--keys binds the given keys, partitions <name>-<key>; delete of a plain stream', async () => {
    const name = uniqueName('cli-keys');
    const stream = uniqueName('cli-plain');
    try {
      const created = await cli(['create-super-stream', name, '--keys', 'eu,us']);
      expect(created.code).toBe(0);
      expect(await client().queryPartitions({ superStream: name })).toEqual([`${name}-eu`, `${name}-us`]);
      expect(await client().routeQuery({ routingKey: 'us', superStream: name })).toEqual([`${name}-us`]);
      expect((await cli(['delete', name, '--yes'])).code).toBe(0);
      expect(await exists(`${name}-eu`)).toBe(false);

      await client().createStream({ stream, arguments: {} });
      const deleted = await cli(['delete', stream, '--yes']);
      expect(deleted).toMatchObject({ code: 0, stdout: `deleted stream "${stream}"\n` });
      expect(await exists(stream)).toBe(false);
    } finally {
      await client()
        .deleteSuperStream({ streamName: name })
        .catch(() => undefined);
      await client()
        .deleteStream({ stream })
        .catch(() => undefined);
    }
  }, 120_000);

  it('delete asks on a terminal: no keeps the stream (exit 1), yes deletes it (exit 0)', async () => {
    const stream = uniqueName('cli-ask');
    await client().createStream({ stream, arguments: {} });
    try {
      const no = await cliOnTerminal(['delete', stream], 'n\n');
      expect(no.out).toContain(`delete stream "${stream}"? [y/N]`);
      expect(no.out).toContain('nothing deleted');
      expect(no.code).toBe(1);
      expect(await exists(stream)).toBe(true);
      const yes = await cliOnTerminal(['delete', stream], 'y\n');
      expect(yes.out).toContain(`deleted stream "${stream}"`);
      expect(yes.code).toBe(0);
      expect(await exists(stream)).toBe(false);
    } finally {
      await client()
        .deleteStream({ stream })
        .catch(() => undefined);
    }
  }, 120_000);
});
