import { createRequire } from 'node:module';
import type { Client } from 'rabbitmq-stream-js-client';
import { describe, expect, it } from 'vitest';
import { splitFullConnections } from '../../src/transport/stream-client-internals.js';

// rabbitmq-stream-js-client 1.0 shares a connection among the publishers (or consumers) of a
// stream through its pool, numbering them from a counter it never winds back; an ID is a u8 on the
// wire. Once a connection had issued 256 IDs, the pool still handed it out while one of them was
// open, and every declare on it threw ERR_OUT_OF_RANGE inside the client (issue 33, item 6;
// measured through the library in test/integration/broker-limits.test.ts).
const require = createRequire(import.meta.url);
const { ConnectionPool } = require('rabbitmq-stream-js-client/dist/connection_pool.js') as {
  ConnectionPool: new (log: unknown) => {
    getConnection(
      entityType: string,
      stream: string,
      vhost: string,
      host: string,
      create: () => Promise<unknown>,
    ): Promise<unknown>;
    cacheConnection(key: string, connection: unknown): void;
    getCacheKey(stream: string, vhost: string, host: string, entityType: string): string;
  };
};

interface FakeConnection {
  name: string;
  publisherId: number;
  consumerId: number;
  refCount: number;
}

function clientWith(cached: FakeConnection, entityType: 'publisher' | 'consumer') {
  const pool = new ConnectionPool({ warn: () => undefined });
  pool.cacheConnection(pool.getCacheKey('s', '/', 'h', entityType), cached);
  let created = 0;
  const get = () =>
    pool.getConnection(entityType, 's', '/', 'h', () => {
      created++;
      return Promise.resolve({ name: `new-${created}`, publisherId: 0, consumerId: 0, refCount: 0 });
    }) as Promise<FakeConnection>;
  return { client: { pool } as unknown as Client, get, created: () => created };
}

describe('shared client connections below 256 IDs', () => {
  it('a connection that has issued 256 publisher IDs is not handed out again: a new one is opened', async () => {
    const { client, get, created } = clientWith(
      { name: 'full', publisherId: 256, consumerId: 0, refCount: 1 },
      'publisher',
    );
    splitFullConnections(client);
    const first = await get();
    expect(first.name).toBe('new-1');
    // The new connection is the pool's from now on.
    expect((await get()).name).toBe('new-1');
    expect(created()).toBe(1);
  });

  it('the same for subscriptions', async () => {
    const { client, get } = clientWith(
      { name: 'full', publisherId: 0, consumerId: 256, refCount: 3 },
      'consumer',
    );
    splitFullConnections(client);
    expect((await get()).name).toBe('new-1');
  });

  it('a connection with IDs left is shared as the client shares it; hooking twice changes nothing', async () => {
    const { client, get, created } = clientWith(
      { name: 'roomy', publisherId: 255, consumerId: 256, refCount: 255 },
      'publisher',
    );
    splitFullConnections(client);
    splitFullConnections(client);
    expect((await get()).name).toBe('roomy');
    expect(created()).toBe(0);
  });

  it('two declares at once on a connection with one ID left: the second goes on a new connection', async () => {
    const { client, get, created } = clientWith(
      { name: 'last-id', publisherId: 255, consumerId: 0, refCount: 1 },
      'publisher',
    );
    splitFullConnections(client);
    const [a, b] = await Promise.all([get(), get()]);
    expect([a.name, b.name]).toEqual(['last-id', 'new-1']);
    expect(created()).toBe(1);
  });

  it('a client without that pool is refused with a clear message', () => {
    let thrown: unknown;
    try {
      splitFullConnections({} as Client);
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toMatchObject({ code: 'DEDUP_BROKER_REFUSED' });
    expect((thrown as Error).message).toMatch(/connection pool/);
  });
});
