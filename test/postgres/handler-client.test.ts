import type { PoolClient } from 'pg';
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
