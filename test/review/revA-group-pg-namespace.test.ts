/**
 * revA (hostile review), identity (REVIEW.md §2): on LevelDB a group partition's namespace is
 * `<group>\0<partition>` — "NUL cannot appear in a stream name, so no plain consumer's name ... is
 * the same" (group/consumer.ts). On PostgreSQL (h/pggroup) it is `<group>.<partition>`
 * (sharedPartitionName), injective among groups only: a PLAIN verifying consumer may be named
 * "billing.orders-0" (a '.' is allowed there), and then it and group "billing"'s partition
 * "orders-0" share one offset row and one set of verifier scopes in the same schema. The partition
 * resumes at the plain consumer's offset of ANOTHER stream (skipping messages) and judges its
 * producers' IDs against the plain consumer's (false suppression: silent loss).
 *
 * Needs the project's PostgreSQL.
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

describe('revA: a plain consumer and a group partition on one PostgreSQL schema', () => {
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
    const part = await VerifyingConsumerCore.open({
      consumerName: sharedPartitionName('billing', 'orders-0'),
      store: groupStore,
      commitEvery: 1,
      handler: postgresHandler((m) => void applied.push(`${m.identity?.producerName}/${m.identity?.publishingId}`)),
    });
    cleanups.push(() => part.close());
    const startsAt = part.committedOffset;
    // The partition's own first message: producer p, ID 1 (a different stream, a different p).
    await part.process({ offset: 0n, content: Buffer.alloc(0), applicationProperties: identityHeaders('p', 1n) });
    await part.flush();
    expect({ startsAt, applied }).toEqual({ startsAt: undefined, applied: ['p/1'] });
  }, 30_000);
});
