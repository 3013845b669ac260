/**
 * `stream-dedup create-super-stream NAME --partitions N | --keys k1,k2,…`: a super stream whose
 * partitions are `NAME-0` … `NAME-(N-1)` (binding keys `0` … `N-1`, as the stream client and
 * RabbitMQ's own tools make them), or `NAME-k1`, `NAME-k2`, … bound with the given keys.
 */
import { DedupError } from '../errors.js';
import type { StreamConnectionOptions } from '../transport/util.js';
import { ask, queryPartitions, withStreamClient } from './broker-client.js';
import { plural } from './output.js';

/** RabbitMQ 4.3 refuses super streams of more partitions (the library's cap is the same). */
export const MAX_PARTITIONS = 1_000;
/** Stream names are queue names: at most 255 UTF-8 bytes. */
const MAX_NAME_BYTES = 255;

/** What to create: the super stream's name, its partitions and their binding keys, in order. */
export interface SuperStreamPlan {
  readonly name: string;
  readonly partitions: readonly string[];
  readonly bindingKeys: readonly string[];
  /** The keys were given (`--keys`), not numbered (`--partitions`). */
  readonly keyed: boolean;
}

/**
 * The plan for `create-super-stream`, or what is wrong with the arguments (a usage error). Exactly
 * one of `--partitions` (an integer from 1 to 1 000) and `--keys` (1 to 1 000 distinct non-empty keys
 * without spaces); every partition name at most 255 UTF-8 bytes. Pure: checked before any I/O.
 */
export function planSuperStream(
  name: string,
  partitions: string | undefined,
  keys: string | undefined,
): SuperStreamPlan | string {
  if (name.length === 0) return 'the super stream name must not be empty';
  if ((partitions === undefined) === (keys === undefined)) {
    return 'give exactly one of --partitions N and --keys k1,k2,…';
  }
  let bindingKeys: string[];
  if (partitions !== undefined) {
    const n = /^[1-9]\d{0,6}$/.test(partitions) ? Number(partitions) : NaN;
    if (!(n >= 1 && n <= MAX_PARTITIONS)) {
      return `--partitions expects an integer from 1 to ${MAX_PARTITIONS} (RabbitMQ 4.3's limit), got ${JSON.stringify(partitions)}`;
    }
    bindingKeys = Array.from({ length: n }, (_, i) => String(i));
  } else {
    bindingKeys = keys!.split(',');
    const bad = bindingKeys.find((k) => k.length === 0 || /\s/.test(k));
    if (bad !== undefined) {
      return `--keys expects non-empty keys without spaces, separated by commas, got ${JSON.stringify(keys)}`;
    }
    if (new Set(bindingKeys).size !== bindingKeys.length) {
      return `--keys must be distinct: ${JSON.stringify(keys)} repeats a key`;
    }
    if (bindingKeys.length > MAX_PARTITIONS) {
      return `--keys gives ${bindingKeys.length} keys: at most ${MAX_PARTITIONS} partitions (RabbitMQ 4.3's limit)`;
    }
  }
  const names = bindingKeys.map((k) => `${name}-${k}`);
  const long = names.find((p) => Buffer.byteLength(p, 'utf8') > MAX_NAME_BYTES);
  if (long !== undefined) {
    return `partition name ${JSON.stringify(long.slice(0, 40))}… is longer than ${MAX_NAME_BYTES} UTF-8 bytes`;
  }
  return { name, partitions: names, bindingKeys, keyed: keys !== undefined };
}

/**
 * Creates the super stream of `plan`. One that already exists is refused (the stream client
 * reports success for it, which would hide different partitions).
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` (it exists, or the broker refused), `DEDUP_BROKER_UNREACHABLE`.
 */
export async function createSuperStream(
  connection: StreamConnectionOptions,
  plan: SuperStreamPlan,
): Promise<string> {
  return withStreamClient(connection, async (client) => {
    const existing = await queryPartitions(client, plan.name);
    if (existing.length > 0) {
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `super stream "${plan.name}" already exists with ${plural(existing.length, 'partition')}: ${existing.join(', ')}`,
      );
    }
    await ask(client, `creating super stream "${plan.name}"`, (c) =>
      plan.keyed
        ? c.createSuperStream({ streamName: plan.name, arguments: {} }, [...plan.bindingKeys])
        : c.createSuperStream({ streamName: plan.name, arguments: {} }, undefined, plan.partitions.length),
    );
    return `created super stream "${plan.name}" with ${plural(plan.partitions.length, 'partition')}: ${plan.partitions.join(', ')}`;
  });
}
