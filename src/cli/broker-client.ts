/**
 * One stream-protocol connection for a housekeeping command (`create-super-stream`, `list`,
 * `delete`): every query bounded in time, a refusal kept with the broker's response code.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { connectStreamClient } from '../transport/stream-probe.js';
import { EndpointRotation, errorText, withTimeout, type StreamConnectionOptions } from '../transport/util.js';

/** Stream protocol response code 2: no stream (for the partitions query: no exchange) of that name. */
export const DOES_NOT_EXIST = 2;

/** The response code in rabbitmq-stream-js-client's "… returned error with code N …" messages. */
export function responseCode(err: unknown): number | undefined {
  const m = err instanceof Error ? /returned error with code (\d+)/.exec(err.message) : null;
  return m === null ? undefined : Number(m[1]);
}

/** Asks the broker through `client`, within 10 s; a refusal is DEDUP_BROKER_REFUSED, silence UNREACHABLE. */
export async function ask<T>(client: Client, what: string, query: (c: Client) => Promise<T>): Promise<T> {
  try {
    return await withTimeout(query(client), 10_000, what);
  } catch (err) {
    const code = responseCode(err) === undefined ? 'DEDUP_BROKER_UNREACHABLE' : 'DEDUP_BROKER_REFUSED';
    throw new DedupError(code, `${what}: ${errorText(err)}`, { cause: err });
  }
}

/** Runs `use` on a client connected to the broker, then closes it (within 5 s, whatever happens). */
export async function withStreamClient<T>(
  connection: StreamConnectionOptions,
  use: (client: Client) => Promise<T>,
): Promise<T> {
  const client = await connectStreamClient(new EndpointRotation(connection).next(), 10_000);
  try {
    return await use(client);
  } finally {
    await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
  }
}

/** The partitions of super stream `name`, in the broker's order; empty when there is none. */
export function queryPartitions(client: Client, name: string): Promise<string[]> {
  return ask(client, `querying the partitions of "${name}"`, (c) =>
    c.queryPartitions({ superStream: name }).catch((err: unknown) => {
      if (responseCode(err) === DOES_NOT_EXIST) return [];
      throw err;
    }),
  );
}
