/**
 * Reads at a changelog's or a partition's head (docs/design.md §12): the genesis a member's own
 * genesis write may have lost to another's, and the first message at an offset (the
 * stalled-partition watch). Each on the reader client it is given, with a subscription of its own.
 */
import { Offset, type Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import type { StreamMessage } from '../transport/stream-delivery.js';
import { consumerCloseEvents, listenDecodeErrors } from '../transport/stream-client-internals.js';
import { errorText, withTimeout } from '../transport/util.js';
import { decodeRecord, GENESIS_ID } from './changelog-entry.js';
import { ownIdentity } from './changelog-identity.js';

/**
 * The start offset in the changelog's genesis (its first message), read after a member's own
 * genesis was confirmed with the broker's last ID 1: the broker kept one of the genesis writes,
 * and only its content says whose.
 *
 * @throws DedupError `DEDUP_CHANGELOG_INVALID` when the first message is not a genesis;
 *   `DEDUP_BROKER_UNREACHABLE` when it does not arrive within `timeoutMs`.
 *
 * @internal
 */
export async function readGenesis(
  client: Client,
  changelog: string,
  producerName: string,
  timeoutMs: number,
  settings?: string,
): Promise<bigint> {
  const { message, failure } = await firstMessage(client, changelog, undefined, timeoutMs);
  if (message === undefined) {
    const cause = failure ?? new Error(`nothing arrived within ${timeoutMs} ms`);
    throw new DedupError(
      'DEDUP_BROKER_UNREACHABLE',
      `reading the genesis of changelog "${changelog}": ${errorText(cause)}`,
      { cause },
    );
  }
  const where = `at the head of "${changelog}"`;
  // The genesis comes before everything: a group that changed its settings since is not refused.
  const identity = ownIdentity(message, producerName, where, settings, { ownSettings: false });
  const record = decodeRecord(message.content, () => false, where);
  if (record.kind !== 'genesis' || identity.publishingId !== GENESIS_ID) {
    throw new DedupError(
      'DEDUP_CHANGELOG_INVALID',
      `changelog "${changelog}" does not begin with its genesis`,
    );
  }
  return record.start;
}

/**
 * The first message of `stream` at offset `from` or after it (its first message when `from` is
 * `undefined`; a chunk that begins before `from` is skipped up to it), or `undefined` when none
 * arrives within `timeoutMs`; `failure` is a decoding failure seen meanwhile. Reads on `client`
 * with a plain consumer, closed before it resolves.
 *
 * @internal
 */
export async function firstMessage(
  client: Client,
  stream: string,
  from: bigint | undefined,
  timeoutMs: number,
): Promise<{ message: StreamMessage | undefined; failure: Error | undefined }> {
  const offset = from === undefined ? Offset.first() : Offset.offset(from);
  let first: ((message: StreamMessage) => void) | undefined;
  const arrived = new Promise<StreamMessage>((resolve) => (first = resolve));
  let failure: Error | undefined;
  const unlisten = listenDecodeErrors(client, (error) => (failure ??= error));
  try {
    const consumer = await withTimeout(
      client.declareConsumer({ stream, offset }, (message) => {
        if (from !== undefined && (message.offset === undefined || message.offset < from)) return;
        const take = first;
        first = undefined;
        take?.(message);
      }),
      timeoutMs,
      `subscribing to "${stream}"`,
    );
    consumerCloseEvents(consumer)?.removeAllListeners(`close_consumer_${consumer.extendedId}`);
    try {
      const message = await withTimeout(arrived, timeoutMs, `reading "${stream}"`).catch(() => undefined);
      return { message, failure };
    } finally {
      await withTimeout(client.closeConsumer(consumer.extendedId), 5_000, 'closing').catch(() => undefined);
    }
  } finally {
    unlisten();
  }
}
