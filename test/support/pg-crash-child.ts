/**
 * A verifying stream consumer on the PostgreSQL store that SIGKILLs itself at a chosen moment, for
 * test/integration/postgres-crash.test.ts. Arguments (JSON in argv[2]): the stream, the schema, the
 * phase ('handler': inside the handler after its SQL; 'before-commit': between the last handler
 * and the batch's commit; 'during-commit': a few ms into the commit's statements; 'none': run to
 * the end) and after how many handler calls. Prints `done` and exits 0 once `lastOffset` is committed.
 */
import { StreamVerifyingConsumer } from '../../src/stream.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { STREAM_CONNECTION } from './broker.js';
import { PG_URL } from './postgres.js';

interface Plan {
  stream: string;
  schema: string;
  phase: 'handler' | 'before-commit' | 'during-commit' | 'none';
  after: number;
  commitEvery: number;
  lastOffset: string;
}

const plan = JSON.parse(process.argv[2]!) as Plan;
const die = (): void => void process.kill(process.pid, 'SIGKILL');
let calls = 0;
const store = await PostgresStore.open({ connectionString: PG_URL, schema: plan.schema });
const consumer = await StreamVerifyingConsumer.open({
  stream: plan.stream,
  consumerName: 'crash-ledger',
  connection: STREAM_CONNECTION,
  store,
  commitEvery: plan.commitEvery,
  handler: postgresHandler(async (message, { client }) => {
    const { account, amount } = JSON.parse(message.body.toString()) as { account: string; amount: number };
    await client.query(
      `INSERT INTO "${plan.schema}".balances (account, amount) VALUES ($1, $2)
       ON CONFLICT (account) DO UPDATE SET amount = balances.amount + excluded.amount`,
      [account, amount],
    );
    await client.query(`INSERT INTO "${plan.schema}".applied (producer, id) VALUES ($1, $2)`, [
      message.identity!.producerName,
      message.identity!.publishingId.toString(),
    ]);
    if (++calls === plan.after && plan.phase === 'handler') die();
  }),
  hooks: {
    beforeCommit: () => {
      if (calls < plan.after) return;
      if (plan.phase === 'before-commit') die();
      if (plan.phase === 'during-commit') setTimeout(die, Math.floor(Math.random() * 4));
    },
  },
});
await consumer.waitForOffset(BigInt(plan.lastOffset));
await consumer.close();
await store.close();
console.log('done');
