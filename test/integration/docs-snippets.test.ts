// The README's short blocks marked ```ts run, run as a newcomer would paste them (issue 38, item 3):
// each in a fresh folder, against the real broker, importing the package by name (mapped to the
// source through a tsconfig `paths`, as the type-check in test/docs/docs.test.ts does). Names are
// made unique per run ('orders' → 'orders-<random>') and the broker's address is the test broker's;
// nothing else of a block is changed. The blocks run in document order, so the consumer reads what
// the publisher block wrote. Streams and queues are deleted afterwards.
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BROKER, uniqueName } from '../support/broker.js';
import { entryPaths, ROOT, snippets } from '../support/doc-snippets.js';
import { useClient } from '../support/stream.js';

const run = promisify(execFile);
const client = useClient();
const blocks = snippets('README.md').filter((s) => s.flags.includes('run'));
const stream = uniqueName('orders');
const queue = uniqueName('orders-amqp');
let dir = '';
// tsx from this repository (the blocks run in a folder outside it).
const TSX = pathToFileURL(join(ROOT, 'node_modules/tsx/dist/loader.mjs')).href;

/** The block as it runs here: unique names, the test broker's address. */
function adapt(code: string): string {
  return code
    .replaceAll("'orders'", `'${stream}'`)
    .replaceAll("'orders-amqp'", `'${queue}'`)
    .replaceAll("hostname: '127.0.0.1', port: 5552", `hostname: '${BROKER.host}', port: ${BROKER.streamPort}`)
    .replaceAll(
      'amqp://guest:guest@127.0.0.1:5672',
      `amqp://${encodeURIComponent(BROKER.username)}:${encodeURIComponent(BROKER.password)}@${BROKER.host}:${BROKER.amqpPort}/${encodeURIComponent(BROKER.vhost)}`,
    );
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'stream-dedup-docs-'));
  const paths = Object.fromEntries(Object.entries(entryPaths()).map(([k, [v]]) => [k, [join(ROOT, v!)]]));
  await writeFile(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2023', paths },
      include: ['*.ts'],
    }),
  );
  await writeFile(join(dir, 'package.json'), JSON.stringify({ type: 'module' }));
  // The README's publisher block needs its stream to exist (its comment says so).
  await client().createStream({ stream, arguments: {} });
});

afterAll(async () => {
  await client()
    .deleteStream({ stream })
    .catch(() => undefined);
  await client()
    .deleteStream({ stream: queue })
    .catch(() => undefined);
  if (dir !== '') await rm(dir, { recursive: true, force: true });
});

describe('docs - the README blocks marked run', () => {
  it('finds the publish, consume and AMQP 0-9-1 blocks', () => {
    expect(blocks.map((b) => b.code.split('\n')[0])).toEqual([
      "import { StreamDedupPublisher } from 'stream-dedup/stream';",
      "import { StreamVerifyingConsumer } from 'stream-dedup/stream';",
      "import { AmqpDedupPublisher } from 'stream-dedup/amqp';",
    ]);
  });

  it('each block runs to its end against the broker, in order, and does what its comments say', async () => {
    const outputs: string[] = [];
    for (const block of blocks) {
      const file = join(dir, `${block.name.replace(/[^a-z0-9]+/gi, '-')}.ts`);
      await writeFile(file, adapt(block.code));
      const { stdout } = await run(process.execPath, ['--import', TSX, file], {
        cwd: dir,
        env: { ...process.env, TSX_TSCONFIG_PATH: join(dir, 'tsconfig.json') },
        timeout: 60_000,
      });
      outputs.push(stdout);
    }
    // The publisher block: the first ID of a new producer, a bigint.
    expect(outputs[0]).toBe('published 1\n');
    // The consumer block's waitForOffset(0n) returned, so offset 0 was committed; the AMQP block
    // published into a stream queue it declared.
    const [meta] = await client().queryMetadata({ streams: [queue] });
    expect(meta?.responseCode, 'the AMQP block declared its stream queue').toBe(1);
  });
});
