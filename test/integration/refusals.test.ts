import { once } from 'node:events';
import { createServer as createHttpServer } from 'node:http';
import net from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isDedupError } from '../../src/errors.js';
import { AmqpDedupPublisher, AmqpVerifyingConsumer } from '../../src/amqp.js';
import { StreamDedupPublisher, StreamVerifyingConsumer } from '../../src/stream.js';
import { BROKER, STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { runCli } from '../support/cli.js';
import { useTempDir } from '../support/tmp.js';

// The operator's first hour: a wrong password, a missing virtual host, the wrong port. Each must
// reject open() with a typed error whose one-line message names the cause — never an unhandled
// rejection or uncaught exception (test/integration/no-unhandled.ts fails the test on one), never
// the password in the message, never a wait for the connect timeout where the broker said no.

const tempDir = useTempDir();
const SECRET = 'not-the-password-7f3a';

/** An HTTP server, and a TCP server that accepts and never answers: two things that are not RabbitMQ. */
let http: ReturnType<typeof createHttpServer>;
let silent: net.Server;
const silentSockets = new Set<net.Socket>();
let httpPort = 0;
let silentPort = 0;
beforeAll(async () => {
  http = createHttpServer((_req, res) => res.end('hello'));
  http.listen(0, '127.0.0.1');
  await once(http, 'listening');
  httpPort = (http.address() as net.AddressInfo).port;
  silent = net.createServer((socket) => {
    silentSockets.add(socket);
    socket.on('close', () => silentSockets.delete(socket));
  });
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  silentPort = (silent.address() as net.AddressInfo).port;
});
afterAll(async () => {
  for (const s of silentSockets) s.destroy();
  http.closeAllConnections();
  await new Promise((r) => http.close(r));
  await new Promise((r) => silent.close(r));
});

/** Awaits `opening`, expects a DedupError with `code` and a message matching `pattern`, without the secret. */
async function expectRefusal(opening: Promise<unknown>, code: string, pattern: RegExp): Promise<void> {
  const err = await opening.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(isDedupError(err), `a DedupError, got ${String(err)}`).toBe(true);
  expect((err as Error).message).not.toContain(SECRET);
  expect((err as Error).message).not.toContain('\n');
  expect(err).toMatchObject({ code });
  expect((err as Error).message).toMatch(pattern);
}

describe('stream protocol - refusals at open()', () => {
  const cases = [
    {
      what: 'a wrong password',
      connection: { ...STREAM_CONNECTION, password: SECRET },
      code: 'DEDUP_BROKER_REFUSED',
      pattern: /refused the login of user "guest": authentication failure/,
    },
    {
      what: 'an unknown virtual host',
      connection: { ...STREAM_CONNECTION, vhost: 'no-such-vhost' },
      code: 'DEDUP_BROKER_REFUSED',
      pattern: /refused virtual host "no-such-vhost"/,
    },
    {
      what: 'an HTTP server on the port',
      connection: () => ({ ...STREAM_CONNECTION, port: httpPort }),
      code: 'DEDUP_BROKER_UNREACHABLE',
      pattern: /does not speak RabbitMQ's stream protocol/,
    },
    {
      what: 'a listener that never answers',
      connection: () => ({ ...STREAM_CONNECTION, port: silentPort }),
      code: 'DEDUP_BROKER_UNREACHABLE',
      pattern: /no answer from 127\.0\.0\.1:\d+ within 1000 ms/,
    },
  ];
  // A refusal must not wait for the connect timeout: 60 s here, so a wait shows as a test time-out.
  const connectTimeoutMs = (what: string): number => (what.includes('never answers') ? 1_000 : 60_000);

  for (const c of cases) {
    it(`publisher: ${c.what}`, async () => {
      const connection = typeof c.connection === 'function' ? c.connection() : c.connection;
      await expectRefusal(
        StreamDedupPublisher.open({
          stream: uniqueName('refused'),
          producerName: 'p',
          store: join(await tempDir(), 'store'),
          connection,
          connectTimeoutMs: connectTimeoutMs(c.what),
        }),
        c.code,
        c.pattern,
      );
    });

    it(`verifying consumer: ${c.what}`, async () => {
      const connection = typeof c.connection === 'function' ? c.connection() : c.connection;
      await expectRefusal(
        StreamVerifyingConsumer.open({
          stream: uniqueName('refused'),
          consumerName: 'c',
          store: join(await tempDir(), 'store'),
          connection,
          connectTimeoutMs: connectTimeoutMs(c.what),
          handler: () => undefined,
        }),
        c.code,
        c.pattern,
      );
    });
  }
});

describe('AMQP 0-9-1 - refusals at open()', () => {
  const url = (user: string, password: string, port: number, vhost = ''): string =>
    `amqp://${user}:${password}@127.0.0.1:${port}/${vhost}`;
  const cases = [
    {
      what: 'a wrong password',
      url: () => url(BROKER.username, SECRET, BROKER.amqpPort),
      code: 'DEDUP_BROKER_REFUSED',
      pattern: /refused the login/,
    },
    {
      what: 'an unknown virtual host',
      url: () => url(BROKER.username, BROKER.password, BROKER.amqpPort, 'no-such-vhost'),
      code: 'DEDUP_BROKER_REFUSED',
      pattern: /refused virtual host "no-such-vhost"/,
    },
    {
      what: 'an HTTP server on the port',
      url: () => url(BROKER.username, SECRET, httpPort),
      code: 'DEDUP_BROKER_UNREACHABLE',
      pattern: /cannot connect to RabbitMQ over AMQP 0-9-1 at 127\.0\.0\.1:\d+/,
    },
    {
      what: 'a listener that never answers',
      url: () => url(BROKER.username, SECRET, silentPort),
      code: 'DEDUP_BROKER_UNREACHABLE',
      // The whole connect is one budget (issue 32, item 10): the message names the option.
      pattern: /did not complete within connectTimeoutMs \(1000 ms\)/,
    },
  ];
  for (const c of cases) {
    const connectTimeoutMs = c.what.includes('never answers') ? 1_000 : 60_000;
    it(`publisher: ${c.what}`, async () => {
      await expectRefusal(
        AmqpDedupPublisher.open({
          url: c.url(),
          queue: uniqueName('refused'),
          producerName: 'p',
          store: join(await tempDir(), 'store'),
          connectTimeoutMs,
        }),
        c.code,
        c.pattern,
      );
    });

    it(`verifying consumer: ${c.what}`, async () => {
      await expectRefusal(
        AmqpVerifyingConsumer.open({
          url: c.url(),
          queue: uniqueName('refused'),
          consumerName: 'c',
          store: join(await tempDir(), 'store'),
          connectTimeoutMs,
          handler: () => undefined,
        }),
        c.code,
        c.pattern,
      );
    });
  }
});

describe('CLI - refusals exit 3 with one line', () => {
  const cli = (args: readonly string[], env: Record<string, string>) =>
    runCli(args, { RABBITMQ_HOST: BROKER.host, RABBITMQ_STREAM_PORT: String(BROKER.streamPort), ...env });

  for (const [what, env, pattern] of [
    ['a wrong password', { RABBITMQ_PASSWORD: SECRET }, /DEDUP_BROKER_REFUSED: .*refused the login/],
    [
      'an unknown virtual host',
      { RABBITMQ_VHOST: 'no-such-vhost' },
      /DEDUP_BROKER_REFUSED: .*"no-such-vhost"/,
    ],
  ] as const) {
    it(`audit: ${what}`, async () => {
      const run = await cli(['audit', uniqueName('refused')], env);
      expect(run.code).toBe(3);
      expect(run.stderr.trimEnd().split('\n')).toHaveLength(1);
      expect(run.stderr).toMatch(pattern);
      expect(run.stderr).not.toContain(SECRET);
    });
  }
});
