import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { isDedupError } from '../../src/errors.js';
import { AmqpDedupPublisher, AmqpVerifyingConsumer } from '../../src/amqp.js';
import {
  readStreamToEnd,
  StreamDedupPublisher,
  StreamVerifyingConsumer,
  type StreamConnectionOptions,
} from '../../src/stream.js';
import { BROKER, uniqueName } from '../support/broker.js';
import { runCli } from '../support/cli.js';
import { useTempDir } from '../support/tmp.js';

// TLS on both protocols, as production brokers run it: a custom CA, a client certificate whose
// key has a passphrase. scripts/rabbitmq.sh makes the CA and certificates with openssl and starts
// the broker with TLS listeners (stream 5551, AMQP 5671), in the chroot of the broker line
// (RABBITMQ_LINE) that the script prints with `tls-dir`; RABBITMQ_TLS_DIR points elsewhere.
const TLS_DIR =
  process.env.RABBITMQ_TLS_DIR ??
  execFileSync('bash', [fileURLToPath(new URL('../../scripts/rabbitmq.sh', import.meta.url)), 'tls-dir'], {
    encoding: 'utf8',
  }).trim();
const STREAM_TLS_PORT = Number(process.env.RABBITMQ_STREAM_TLS_PORT ?? 5551);
const AMQP_TLS_PORT = Number(process.env.RABBITMQ_AMQP_TLS_PORT ?? 5671);

function tlsFile(name: string): string {
  const path = join(TLS_DIR, name);
  if (!existsSync(path)) {
    throw new Error(
      `the TLS tests need the test CA and certificates in ${TLS_DIR} (made by \`bash scripts/rabbitmq.sh up\`; ` +
        `or set RABBITMQ_TLS_DIR to a folder with ca.pem, client.pem, client-key.pem, client-key.passphrase)`,
    );
  }
  return readFileSync(path, 'utf8');
}

const tls = () => ({
  ca: tlsFile('ca.pem'),
  cert: tlsFile('client.pem'),
  key: tlsFile('client-key.pem'),
  passphrase: tlsFile('client-key.passphrase').trim(),
});
const tempDir = useTempDir();

const streamConnection = (): StreamConnectionOptions => ({
  hostname: BROKER.host,
  port: STREAM_TLS_PORT,
  username: BROKER.username,
  password: BROKER.password,
  ssl: tls(),
});

async function rejection(p: Promise<unknown>): Promise<Error> {
  return p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e as Error,
  );
}

describe('TLS - stream protocol', () => {
  it('publishes, consumes and reads back over TLS with a custom CA and a client certificate', async () => {
    const stream = uniqueName('tls');
    const dir = await tempDir();
    const pub = await StreamDedupPublisher.open({
      connection: streamConnection(),
      stream,
      createStream: true,
      producerName: 'tls-producer',
      store: join(dir, 'p'),
    });
    const sent = await Promise.all(Array.from({ length: 200 }, (_, i) => pub.send(Buffer.from(`m${i + 1}`))));
    expect(sent.at(-1)).toEqual({ publishingId: 200n, outcome: 'published' });
    await pub.close();

    const applied: string[] = [];
    const consumer = await StreamVerifyingConsumer.open({
      connection: streamConnection(),
      stream,
      consumerName: 'tls-consumer',
      store: join(dir, 'c'),
      handler: (message) => void applied.push(message.body.toString()),
    });
    await consumer.waitForOffset(199n);
    await consumer.close();
    expect(applied).toHaveLength(200);

    const records = await readStreamToEnd(streamConnection(), stream);
    expect(records.map((r) => r.body.toString())).toEqual(applied);
  });

  it('a broker certificate the CA did not sign is refused, and no secret is in the error', async () => {
    const { passphrase, cert, key } = tls();
    const err = await rejection(
      StreamDedupPublisher.open({
        // The client certificate is no CA: the broker's certificate cannot be verified with it.
        connection: { ...streamConnection(), ssl: { ca: cert, cert, key, passphrase } },
        stream: uniqueName('tls'),
        producerName: 'p',
        store: join(await tempDir(), 'p'),
        connectTimeoutMs: 5_000,
      }),
    );
    expect(isDedupError(err, 'DEDUP_BROKER_UNREACHABLE')).toBe(true);
    expect(err.message).toMatch(/certificate/);
    expect(err.message).not.toContain(passphrase);
    expect(err.message).not.toContain(BROKER.password === 'guest' ? '\0' : BROKER.password);
  });

  it('a wrong key passphrase is a TypeError before any connection, without the passphrase', async () => {
    const wrong = 'wrong-passphrase-4b1c';
    const opening = StreamDedupPublisher.open({
      connection: { ...streamConnection(), ssl: { ...tls(), passphrase: wrong } },
      stream: uniqueName('tls'),
      producerName: 'p',
      store: join(await tempDir(), 'p'),
    });
    const err = await rejection(opening);
    expect(err).toBeInstanceOf(TypeError);
    expect(err.message).toMatch(/connection\.ssl: .*passphrase/);
    expect(err.message).not.toContain(wrong);
  });
});

describe('TLS - AMQP 0-9-1', () => {
  const url = `amqps://${BROKER.username}:${BROKER.password}@${BROKER.host}:${AMQP_TLS_PORT}`;

  it('publishes and consumes over amqps:// with a custom CA and a client certificate', async () => {
    const queue = uniqueName('tls-amqp');
    const dir = await tempDir();
    const pub = await AmqpDedupPublisher.open({
      url,
      socketOptions: tls(),
      queue,
      declareQueue: true,
      producerName: 'tls-amqp-producer',
      store: join(dir, 'p'),
    });
    for (let i = 1; i <= 50; i++) await pub.send(Buffer.from(`m${i}`));
    await pub.close();
    const applied: string[] = [];
    const consumer = await AmqpVerifyingConsumer.open({
      url,
      socketOptions: tls(),
      queue,
      consumerName: 'tls-amqp-consumer',
      store: join(dir, 'c'),
      handler: (message) => void applied.push(message.body.toString()),
    });
    await consumer.waitForOffset(49n);
    await consumer.close();
    expect(applied).toEqual(Array.from({ length: 50 }, (_, i) => `m${i + 1}`));
  });

  it('a wrong key passphrase is a TypeError before any connection, without the passphrase', async () => {
    const wrong = 'wrong-passphrase-9e2d';
    const publisherErr = await rejection(
      AmqpDedupPublisher.open({
        url,
        socketOptions: { ...tls(), passphrase: wrong },
        queue: uniqueName('tls-amqp'),
        producerName: 'p',
        store: '/nonexistent/never-opened',
      }),
    );
    expect(publisherErr).toBeInstanceOf(TypeError);
    expect(publisherErr.message).toMatch(/socketOptions: .*passphrase/);
    expect(publisherErr.message).not.toContain(wrong);
    const err = await rejection(
      AmqpVerifyingConsumer.open({
        url,
        socketOptions: { ...tls(), passphrase: wrong },
        queue: uniqueName('tls-amqp'),
        consumerName: 'c',
        store: '/nonexistent/never-opened',
        handler: () => undefined,
      }),
    );
    expect(err).toBeInstanceOf(TypeError);
    expect(err.message).not.toContain(wrong);
  });
});

describe('TLS - CLI', () => {
  const cli = (args: readonly string[], env: Record<string, string>) =>
    runCli(args, { RABBITMQ_HOST: BROKER.host, ...env });

  it('audit reads the TLS settings from the environment', async () => {
    const stream = uniqueName('tls-cli');
    const pub = await StreamDedupPublisher.open({
      connection: streamConnection(),
      stream,
      createStream: true,
      producerName: 'tls-cli',
      store: join(await tempDir(), 'p'),
    });
    await pub.send(Buffer.from('one'));
    await pub.close();
    const env = {
      RABBITMQ_STREAM_PORT: String(STREAM_TLS_PORT),
      RABBITMQ_TLS_CA_FILE: join(TLS_DIR, 'ca.pem'),
      RABBITMQ_TLS_CERT_FILE: join(TLS_DIR, 'client.pem'),
      RABBITMQ_TLS_KEY_FILE: join(TLS_DIR, 'client-key.pem'),
      RABBITMQ_TLS_KEY_PASSPHRASE: tls().passphrase,
    };
    const ok = await cli(['audit', stream, '--json'], env);
    expect(ok.stderr).toBe('');
    expect(ok.code).toBe(0);
    expect(JSON.parse(ok.stdout)).toMatchObject({ messages: 1 });
    // Without the CA the broker's certificate is not trusted: exit 3, one line, no passphrase.
    const untrusted = await cli(['audit', stream], {
      ...env,
      RABBITMQ_TLS_CA_FILE: join(TLS_DIR, 'client.pem'),
    });
    expect(untrusted.code).toBe(3);
    expect(untrusted.stderr.trimEnd().split('\n')).toHaveLength(1);
    expect(untrusted.stderr).not.toContain(env.RABBITMQ_TLS_KEY_PASSPHRASE);
  });
});
