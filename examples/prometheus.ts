// Metrics for Prometheus: the OpenTelemetry SDK with its Prometheus exporter serves /metrics, which
// docs/grafana-dashboard.json charts. Publishes and verifies a few messages, then prints the
// library's lines of the page a Prometheus server would scrape.
//   npx tsx examples/prometheus.ts        (broker: scripts/rabbitmq.sh up; port: PROMETHEUS_PORT, 9464)
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { metrics } from '@opentelemetry/api';
import { PrometheusExporter } from '@opentelemetry/exporter-prometheus';
import { MeterProvider } from '@opentelemetry/sdk-metrics';
import { connect } from 'rabbitmq-stream-js-client';
import { StreamDedupPublisher, StreamVerifyingConsumer } from 'stream-dedup/stream';

// Install the SDK before the first publisher or consumer opens: they make their instruments then.
const port = Number(process.env.PROMETHEUS_PORT ?? 9464);
const exporter = new PrometheusExporter({ port });
metrics.setGlobalMeterProvider(new MeterProvider({ readers: [exporter] }));

const connection = {
  hostname: process.env.RABBITMQ_HOST ?? '127.0.0.1',
  port: Number(process.env.RABBITMQ_STREAM_PORT ?? 5552),
  // Credentials from the environment (the test broker's defaults otherwise), never in code.
  username: process.env.RABBITMQ_USER ?? 'guest',
  password: process.env.RABBITMQ_PASSWORD ?? 'guest',
};
const stream = `example-prometheus-${Date.now()}`;
const dir = await mkdtemp(join(tmpdir(), 'example-'));

const pub = await StreamDedupPublisher.open({
  connection,
  stream,
  createStream: true,
  producerName: 'orders-svc',
  store: join(dir, 'publisher'),
});
await Promise.all(Array.from({ length: 100 }, (_, i) => pub.send(Buffer.from(`order ${i}`))));
await pub.close();

const consumer = await StreamVerifyingConsumer.open({
  connection,
  stream,
  consumerName: 'projection',
  store: join(dir, 'consumer'),
  handler: () => undefined,
});
await consumer.waitForOffset(99n);

// What Prometheus scrapes (the consumer is still open, so its series are on the page).
const page = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
for (const line of page.split('\n')) if (line.startsWith('stream_dedup_')) console.log(line);
await consumer.close();
await exporter.shutdown();

// An example deletes what it made (an application keeps its stream, of course).
const admin = await connect({ ...connection, vhost: '/' });
await admin.deleteStream({ stream });
await admin.close();
console.log(`deleted stream ${stream}`);
