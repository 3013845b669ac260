/**
 * A plain verifying consumer and a consumer group's partition on one PostgreSQL schema do not
 * share an offset row or verifier scopes. The partition's rows were kept under
 * `<group>.<partition>`, injective among groups only: a plain consumer named "billing.orders-0"
 * (a '.' is allowed) and group "billing"'s partition "orders-0" shared one row, so the partition
 * resumed at the other consumer's offset and judged its producers' IDs against the other's (false
 * suppression). Found by the hostile review (revA finding 2). Now `<group>` U+001F `<partition>`,
 * and a plain name holding U+001F is refused on such a store before any I/O.
 *
 * Needs the project's PostgreSQL (fails loudly without it); about 300 ms.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { VerifyingConsumerCore } from '../../src/consumer/core.js';
import { sharedPartitionName } from '../../src/group/shared-db-strategy.js';
import { identityHeaders } from '../../src/identity/headers.js';
import { postgresHandler } from '../../src/postgres/handler.js';
import { PostgresStore } from '../../src/postgres/store.js';
import { useSchema } from '../support/postgres.js';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe('a plain consumer and a group partition on one PostgreSQL schema', () => {
  it('do not share an offset row or verifier scopes', async () => {
    const db = await useSchema();
    cleanups.push(db.drop);
    // A plain consumer of some stream, named with a '.' (accepted).
    const plainStore = await PostgresStore.open({ pool: db.pool, schema: db.schema });
    const plain = await VerifyingConsumerCore.open({
      consumerName: 'billing.orders-0',
      store: plainStore,
      commitEvery: 1,
      handler: postgresHandler(() => undefined),
    });
    for (let i = 0; i < 50; i++) {
      await plain.process({
        offset: BigInt(i),
        content: Buffer.alloc(0),
        applicationProperties: identityHeaders('p', BigInt(i + 1)),
      });
    }
    await plain.flush();
    await plain.close();
    await plainStore.close();

    // Group "billing", partition "orders-0": its core, opened as group/partition.ts opens it.
    const groupStore = await PostgresStore.open({ pool: db.pool, schema: db.schema });
    cleanups.push(() => groupStore.close());
    const applied: string[] = [];
    const part = await VerifyingConsumerCore.open(
      {
        consumerName: sharedPartitionName('billing', 'orders-0'),
        store: groupStore,
        commitEvery: 1,
        handler: postgresHandler(
          (m) => void applied.push(`${m.identity?.producerName}/${m.identity?.publishingId}`),
        ),
      },
      { groupPartition: true },
    );
    cleanups.push(() => part.close());
    const startsAt = part.committedOffset;
    // The partition's own first message: producer p, ID 1 (a different stream, a different p).
    await part.process({
      offset: 0n,
      content: Buffer.alloc(0),
      applicationProperties: identityHeaders('p', 1n),
    });
    await part.flush();
    expect({ startsAt, applied }).toEqual({ startsAt: undefined, applied: ['p/1'] });
  });

  it("refuses a plain consumer's name holding the partition separator, before any I/O", async () => {
    const opened: string[] = [];
    const err: unknown = await VerifyingConsumerCore.open({
      consumerName: sharedPartitionName('billing', 'orders-0'),
      store: {
        openConsumerStore: (name: string) => {
          opened.push(name);
          throw new Error('I/O');
        },
      },
      handler: () => undefined,
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RangeError);
    expect({ message: String(err).includes('U+001F'), opened }).toEqual({ message: true, opened: [] });
  });
});
