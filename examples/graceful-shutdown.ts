// A service that publishes and consumes until it is told to stop (SIGTERM from a process manager,
// Ctrl-C in a terminal), then closes cleanly: accepted sends get their confirms (up to
// closeTimeoutMs), the consumer commits what its handler applied, and the producer name is freed.
// `await using` does not run on a signal — Node's default for SIGTERM is to exit at once — so the
// service installs its own handler.
//   npx tsx examples/graceful-shutdown.ts        (then: kill -TERM <pid>, or Ctrl-C)
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDedupError } from 'stream-dedup';
import { StreamDedupPublisher, StreamVerifyingConsumer } from 'stream-dedup/stream';

const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
};
const stream = process.env.EXAMPLE_STREAM ?? `example-shutdown-${Date.now()}`;
const dir = await mkdtemp(join(tmpdir(), 'example-'));

const pub = await StreamDedupPublisher.open({
  connection,
  stream,
  createStream: true,
  producerName: 'shutdown-demo',
  store: join(dir, 'p'),
});
let applied = 0;
const consumer = await StreamVerifyingConsumer.open({
  connection,
  stream,
  consumerName: 'shutdown-demo-projection',
  store: join(dir, 'c'),
  handler: (message, tx) => {
    tx.put(`order:${message.identity?.publishingId}`, message.body);
    applied++;
  },
});

let stopping = false;
let sent = 0;
let confirmed = 0;
let rejected = 0;
async function shutdown(signal: string): Promise<void> {
  if (stopping) return;
  stopping = true;
  const started = performance.now();
  // The publisher first: its accepted sends confirm (or stay in the outbox); then the consumer
  // commits its last batch and frees its subscription.
  const results = await Promise.allSettled([pub.close(), consumer.close()]);
  const closeMs = Math.round(performance.now() - started);
  const failed = results.filter((r) => r.status === 'rejected').length;
  console.log(JSON.stringify({ stopped: signal, closeMs, sent, confirmed, rejected, applied, failed }));
  process.exitCode = failed === 0 && rejected === 0 ? 0 : 1;
}
for (const signal of ['SIGTERM', 'SIGINT'] as const) process.once(signal, () => void shutdown(signal));

// The work: a bounded number of sends in flight, until the signal.
console.log(JSON.stringify({ ready: true, pid: process.pid, stream }));
const inFlight = new Set<Promise<void>>();
while (!stopping) {
  const p: Promise<void> = pub
    .send(Buffer.from(`order ${++sent}`))
    .then(
      () => void confirmed++,
      (err: unknown) => {
        // A send still unconfirmed when close() gave up stays in the outbox for the next open().
        if (!isDedupError(err, 'DEDUP_PUBLISHER_CLOSED')) throw err;
        rejected++;
      },
    )
    .finally(() => inFlight.delete(p));
  inFlight.add(p);
  if (inFlight.size >= 1_000) await Promise.race(inFlight);
  if (sent % 5_000 === 0) console.log(JSON.stringify({ sent, confirmed, applied }));
}
await Promise.all(inFlight);
