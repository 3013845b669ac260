import type { Client } from 'rabbitmq-stream-js-client';
import type { GroupMessageHandler } from '../../src/group/types.js';

/** What one partition was sent: its last offset, and the exactly-once fold of its distinct messages. */
export interface Sent {
  lastOffset: bigint;
  balance: number;
  distinct: number;
}

/**
 * Publishes `count` credit events to each partition under producer `ledger`, IDs continuing from
 * `fromId`, every fifth one published a second time a few messages later (a planted redelivery:
 * same identity, same body), and waits for every confirm. Adds what it sent to `sent`.
 */
export async function publishLedger(
  c: Client,
  partitions: readonly string[],
  fromId: number,
  count: number,
  sent: Map<string, Sent>,
): Promise<void> {
  for (const partition of partitions) {
    const publisher = await c.declarePublisher({ stream: partition });
    let sentCount = 0;
    let confirmed = 0;
    let allConfirmed = (): void => undefined;
    publisher.on('publish_confirm', (_err, ids) => {
      confirmed += ids.length;
      if (confirmed >= sentCount) allConfirmed();
    });
    const s = sent.get(partition) ?? { lastOffset: -1n, balance: 0, distinct: 0 };
    for (let id = fromId; id < fromId + count; id++) {
      s.balance += (id % 13) + 1;
      s.distinct++;
    }
    for (const id of ledgerIds(fromId, count)) {
      sentCount++;
      await publisher.send(Buffer.from(JSON.stringify({ amount: (id % 13) + 1 })), {
        applicationProperties: { 'x-dedup-producer': 'ledger', 'x-dedup-id': String(id) },
      });
    }
    s.lastOffset += BigInt(sentCount);
    const done = new Promise<void>((resolve) => (allConfirmed = resolve));
    await publisher.flush();
    if (confirmed < sentCount) await done;
    await publisher.close();
    sent.set(partition, s);
  }
}

/**
 * The IDs {@link publishLedger} sends to each partition, in order: `fromId` … `fromId + count - 1`,
 * every fifth one again a few messages later.
 */
export function ledgerIds(fromId: number, count: number): number[] {
  const ids: number[] = [];
  const replays: number[] = [];
  for (let id = fromId; id < fromId + count; id++) {
    ids.push(id);
    if (id % 5 === 0) replays.push(id);
    if (replays.length > 0 && id % 5 === 3) ids.push(replays.shift()!);
  }
  return [...ids, ...replays];
}

/** The credit-17 projection: balance, count, and a mark per applied ID (a second one is a double). */
export const ledgerHandler: GroupMessageHandler = async (message, tx) => {
  const { amount } = JSON.parse(message.body.toString()) as { amount: number };
  const id = message.identity!.publishingId.toString();
  if ((await tx.get(`applied:${id}`)) !== undefined) tx.put('doubles', id);
  tx.put(`applied:${id}`, '1');
  const balance = Number((await tx.get('balance'))?.toString() ?? 0);
  tx.put('balance', String(balance + amount));
  const count = Number((await tx.get('count'))?.toString() ?? 0);
  tx.put('count', String(count + 1));
};
