/**
 * The child process of bench:recover that leaves an outbox behind: it opens a StreamDedupPublisher
 * (durability 'outbox') through bench/publish-dropping-proxy.ts, which passes everything but the
 * Publish frames, and sends COUNT messages of SIZE bytes. Each group commit is written before its
 * messages leave (docs/design.md §4.2), so every message reaches the store; none reaches the
 * broker, so none is confirmed and the outbox keeps them all. The parent watches the frames at the
 * proxy, SIGKILLs this process once the last ID went by, and checks the store.
 *
 *   node --import tsx bench/recover-fill.ts <proxy port> <stream> <store folder> <producer name> <count> <size>
 */
import { randomBytes } from 'node:crypto';
import { StreamDedupPublisher } from '../src/stream.js';

const args = process.argv.slice(2);
if (args.length !== 6)
  throw new Error('usage: recover-fill.ts <port> <stream> <store> <producer> <count> <size>');
const [port = '', stream = '', store = '', producerName = '', count = '', size = ''] = args;
const COUNT = Number(count);
const endpoint = { host: '127.0.0.1', port: Number(port) };

// Never outlive the parent for long: it kills this process within seconds of the last frame.
setTimeout(() => {
  console.error('recover-fill: not killed within 120 s');
  process.exit(2);
}, 120_000).unref();

const pub = await StreamDedupPublisher.open({
  // The locator and the producer's connection both through the proxy (not the advertised host).
  connection: { hostname: endpoint.host, port: endpoint.port, addressResolver: { enabled: true, endpoint } },
  stream,
  producerName,
  store,
  durability: 'outbox',
  // Every message accepted at once (sends beyond maxInFlight would wait unwritten), and no
  // confirm timeout while the parent waits: a timeout would reconnect and re-send.
  maxInFlight: COUNT,
  confirmTimeoutMs: 600_000,
});
// Random bodies, one per message: LevelDB compresses its tables (Snappy), and an outbox of
// identical bodies would shrink to a few percent of what an application's messages take.
const SIZE = Number(size);
const bodies = randomBytes(COUNT * SIZE);
for (let i = 0; i < COUNT; i++) {
  // Never resolves (no confirm comes); the process dies with it.
  pub.send(bodies.subarray(i * SIZE, (i + 1) * SIZE)).catch((err: unknown) => {
    console.error('recover-fill: send failed', err);
    process.exit(3);
  });
}
console.log(JSON.stringify({ accepted: pub.inFlight }));
// The open publisher keeps this process alive until the parent's SIGKILL.
