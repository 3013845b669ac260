import type { PoolClient } from 'pg';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { HandlerTransaction } from '../../src/postgres/handler-client.js';

/** A connection that records what it is asked to send. */
function recording(): { connection: PoolClient; sent: unknown[] } {
  const sent: unknown[] = [];
  const connection = {
    query: (first: unknown) => {
      sent.push(first);
      return Promise.resolve({ rows: [] });
    },
  } as unknown as PoolClient;
  return { connection, sent };
}

describe('HandlerTransaction - the text checked is the text sent', () => {
  it('sends a copy of a config object read once, not the object a later assignment changes', async () => {
    const { connection, sent } = recording();
    const misuses: Error[] = [];
    const tx = new HandlerTransaction(connection, (e) => misuses.push(e));
    const reads: string[] = ['SELECT 1', 'ROLLBACK'];
    // A getter answers the check with harmless SQL and pg, later, with a ROLLBACK.
    const config = {
      get text() {
        return reads.shift() ?? 'ROLLBACK';
      },
      values: [],
    };
    await tx.client.query(config);
    expect(misuses).toEqual([]);
    expect(sent).toHaveLength(1);
    expect(sent[0]).not.toBe(config);
    expect((sent[0] as { text: string }).text).toBe('SELECT 1');
    // Reading it again gives the same text: a plain value, no getter.
    expect((sent[0] as { text: string }).text).toBe('SELECT 1');
  });

  it('refuses a Submittable (pg.Query, a cursor): pg gives it the raw connection and reads its text late', async () => {
    const { connection, sent } = recording();
    const misuses: Error[] = [];
    const tx = new HandlerTransaction(connection, (e) => misuses.push(e));
    const submittable = { text: 'SELECT 1', submit: () => undefined };
    await expect(tx.client.query(submittable as never)).rejects.toThrow(/Submittable/);
    expect(misuses).toHaveLength(1);
    expect(misuses[0]).toBeInstanceOf(TypeError);
    expect(sent).toEqual([]);
  });
});

describe('HandlerTransaction - a statement of unknown outcome poisons the batch', () => {
  function failing(err: Error): PoolClient {
    return {
      query: (...args: unknown[]) => {
        const callback = args.at(-1);
        if (typeof callback === 'function') {
          (callback as (e: Error) => void)(err);
          return undefined;
        }
        return Promise.reject(err);
      },
    } as unknown as PoolClient;
  }

  it.each([
    ['a client-side time-out', new Error('Query read timeout'), true],
    ['a lost connection', Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }), true],
    ['a server error (SQLSTATE)', new pg.DatabaseError('division by zero', 0, 'error'), false],
  ])('%s, through a promise or a callback', async (_what, err, poisons) => {
    const poisoned: Error[] = [];
    const tx = new HandlerTransaction(
      failing(err),
      () => undefined,
      (e) => poisoned.push(e),
    );
    await expect(tx.client.query('SELECT 1')).rejects.toBe(err);
    const seen = await new Promise((resolve) => {
      tx.client.query('SELECT 1', [], (e: Error) => resolve(e));
    });
    expect(seen).toBe(err);
    expect(poisoned).toEqual(poisons ? [err, err] : []);
  });
});
