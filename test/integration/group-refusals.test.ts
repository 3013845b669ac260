import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { changelogStreamName } from '../../src/group/consumer.js';
import { SuperStreamVerifyingConsumer } from '../../src/stream.js';
import { STREAM_CONNECTION, uniqueName } from '../support/broker.js';
import { ledgerHandler, publishLedger, type Sent } from '../support/group-ledger.js';
import { useClient } from '../support/stream.js';
import { useSuperStreams } from '../support/superstream.js';
import { useTempDir } from '../support/tmp.js';

// A consumer group member whose user may read and write the application's streams but not the
// group's changelogs (issue 32, item 14): it must stop with DEDUP_BROKER_REFUSED and the broker's
// response code, not retry for ever re-running its handler. The user is made with rabbitmqctl in
// scripts/rabbitmq.sh's chroot of the line under test (not restarted), and removed after the file's tests.

const run = promisify(execFile);
const SCRIPT = fileURLToPath(new URL('../../scripts/rabbitmq.sh', import.meta.url));

/**
 * rabbitmqctl on the single broker of the line under test, through scripts/rabbitmq.sh (root). A
 * run that cannot administer the broker fails here, loudly: nothing is skipped.
 */
async function rabbitmqctl(...args: string[]): Promise<void> {
  await run('bash', [SCRIPT, 'ctl', ...args]);
}

const client = useClient();
const superStream = useSuperStreams(client);
const tempDir = useTempDir();
/** Two users: one with no access to changelogs, one that may read them but not create or write them. */
const users = { none: uniqueName('group-refused'), readOnly: uniqueName('group-refused') };
const password = uniqueName('pw');

beforeAll(async () => {
  // Everything but the changelogs.
  const notChangelogs = '^(?!.*\\.changelog$).*$';
  await rabbitmqctl('add_user', users.none, password);
  await rabbitmqctl('set_permissions', '-p', '/', users.none, notChangelogs, notChangelogs, notChangelogs);
  await rabbitmqctl('add_user', users.readOnly, password);
  await rabbitmqctl('set_permissions', '-p', '/', users.readOnly, notChangelogs, notChangelogs, '.*');
});
afterAll(async () => {
  for (const user of Object.values(users)) await rabbitmqctl('delete_user', user).catch(() => undefined);
});

/** Opens a member as `user` over a new super stream with input; resolves with what stopped it. */
async function refusedMember(
  user: string,
  changelogsExist = false,
): Promise<{ error: unknown; handled: number; ms: number }> {
  const name = await superStream('group-refused');
  const partitions = await client().queryPartitions({ superStream: name });
  if (changelogsExist) {
    for (const partition of partitions) {
      const changelog = changelogStreamName(partition, 'refused');
      await client().createStream({ stream: changelog, arguments: {} });
      onTestFinished(async () => {
        await client().deleteStream({ stream: changelog });
      });
    }
  }
  await publishLedger(client(), partitions, 1, 5, new Map<string, Sent>());
  let handled = 0;
  const started = performance.now();
  const error = await SuperStreamVerifyingConsumer.open({
    superStream: name,
    consumerName: 'refused',
    store: await tempDir(),
    connection: { ...STREAM_CONNECTION, username: user, password },
    startFrom: 'first',
    commitEvery: 100,
    commitLingerMs: 10,
    appendTimeoutMs: 20_000,
    handler: (message, tx, partition) => {
      handled++;
      return ledgerHandler(message, tx, partition);
    },
  }).then(
    (member) => member.closed(),
    (err: unknown) => err,
  );
  return { error, handled, ms: performance.now() - started };
}

describe('consumer group - a changelog the broker refuses', () => {
  it('no access to the changelogs: open() rejects with DEDUP_BROKER_REFUSED and the response code, no handler run', async () => {
    const { error, handled } = await refusedMember(users.none);
    expect(error).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((error as Error).message).toMatch(/access refused \(broker response code 16\)/);
    expect(handled).toBe(0);
  }, 60_000);

  it('changelogs that exist, readable, not writable: open() rejects with DEDUP_BROKER_REFUSED (code 16), no handler run', async () => {
    // The changelogs were created by another user (a member with configure rights, an operator).
    // Before: open() succeeded, the handler ran on every partition's first batch, and the member
    // stopped only at its first append.
    const { error, handled } = await refusedMember(users.readOnly, true);
    expect(error).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((error as Error).message).toMatch(
      /cannot be written by producer .*access refused \(broker response code 16\)/,
    );
    expect(handled).toBe(0);
  }, 60_000);

  it('changelogs readable, not writable: the member stops with DEDUP_BROKER_REFUSED at its first append, not after appendTimeoutMs', async () => {
    const { error, handled, ms } = await refusedMember(users.readOnly);
    expect(error).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((error as Error).message).toMatch(/broker response code (16|2)\b/);
    // Before: DEDUP_BROKER_UNREACHABLE warnings every appendTimeoutMs (20 s), for ever, the handler re-run.
    expect(ms).toBeLessThan(15_000);
    // One batch per partition at most (6 messages each, a planted redelivery included).
    expect(handled).toBeLessThanOrEqual(3 * 6);
  }, 60_000);
});

describe('consumer group - a changelog deleted by hand', () => {
  it('a member that holds state from it stops with DEDUP_CHANGELOG_INVALID once take-overs kept hearing it is gone (30 s), instead of retrying for ever', async () => {
    const name = await superStream('group-deleted', 1);
    const [partition] = await client().queryPartitions({ superStream: name });
    const sent = new Map<string, Sent>();
    await publishLedger(client(), [partition!], 1, 5, sent);
    const store = await tempDir();
    const options = {
      superStream: name,
      consumerName: 'deleted',
      store,
      connection: STREAM_CONNECTION,
      startFrom: 'first' as const,
      commitLingerMs: 10,
      handler: ledgerHandler,
    };
    const first = await SuperStreamVerifyingConsumer.open(options);
    await first.waitForOffset(partition!, sent.get(partition!)!.lastOffset);
    await first.close();
    await client().deleteStream({ stream: changelogStreamName(partition!, 'deleted') });

    const started = performance.now();
    const error = await SuperStreamVerifyingConsumer.open(options).then(
      (member) => member.closed(),
      (err: unknown) => err,
    );
    expect(error).toMatchObject({ code: 'DEDUP_CHANGELOG_INVALID' });
    expect((error as Error).message).toMatch(/has not existed for 30 s of take-overs/);
    expect(performance.now() - started).toBeLessThan(60_000);
  }, 90_000);
});
