/**
 * One relay life for bench/outbox.ts's kill comparison. Argument: JSON { relay: 'exactly-once' |
 * 'at-least-once', url, schema, stream, producerName }. Prints `publishing` once it publishes (the
 * parent SIGKILLs it some time after), and `done` once its table is empty (then exits 0).
 */
import pg from 'pg';
import { PgOutboxRelay } from 'stream-dedup/postgres';
import { CONNECTION, connectClient } from './common.js';
import { runNaiveRelay } from './outbox-naive-relay.js';

const plan = JSON.parse(process.argv[2]!) as {
  relay: 'exactly-once' | 'at-least-once';
  url: string;
  schema: string;
  stream: string;
  producerName: string;
};
const pool = new pg.Pool({ connectionString: plan.url, max: 4 });
pool.on('error', () => undefined);
const left = async (): Promise<number> => {
  // The exactly-once relay's unconfirmed rows are in the outbox or in its batch records.
  const { rows } = await pool.query<{ n: number }>(
    plan.relay === 'exactly-once'
      ? `SELECT ((SELECT count(*) FROM "${plan.schema}".outbox) +
                 (SELECT coalesce(sum(cardinality(row_ids)), 0) FROM "${plan.schema}".outbox_batches))::int AS n`
      : `SELECT count(*)::int AS n FROM "${plan.schema}".naive_outbox`,
  );
  return rows[0]!.n;
};
if (plan.relay === 'at-least-once') {
  const client = await connectClient();
  let said = false;
  // After its first committed batch, as the exactly-once relay says it after its first confirm:
  // the kill then lands while it publishes, not while it starts.
  await runNaiveRelay({
    pool,
    schema: plan.schema,
    client,
    stream: plan.stream,
    untilEmpty: true,
    onBatch: () => {
      if (!said) console.log('publishing');
      said = true;
    },
  });
  await client.close();
} else {
  let said = false;
  const relay = await PgOutboxRelay.open({
    pool,
    schema: plan.schema,
    producerName: plan.producerName,
    stream: plan.stream,
    connection: CONNECTION,
    onEvent: (e) => {
      if (e.type === 'confirmed' && !said) {
        said = true;
        console.log('publishing');
      }
    },
  });
  while ((await left()) > 0) await new Promise((resolve) => setTimeout(resolve, 20));
  await relay.close();
}
console.log('done');
await pool.end();
process.exit(0);
