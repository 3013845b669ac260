/**
 * Hash routing for super streams, as every RabbitMQ stream client does it (Java, Go, .NET, Python,
 * Rust, JavaScript): MurmurHash3 (x86, 32-bit) of the routing key's UTF-8 bytes with seed 104729,
 * as an unsigned integer, modulo the number of partitions, over the partitions in the order the
 * broker lists them. Routing a key like the other clients do keeps one key in one partition
 * whichever client publishes it (issue 18).
 */

/** The seed every RabbitMQ stream client hashes routing keys with. */
export const ROUTING_SEED = 104_729;

const C1 = 0xcc9e2d51;
const C2 = 0x1b873593;

/** MurmurHash3 x86 32-bit of `bytes`, as an unsigned 32-bit integer. */
export function murmur3(bytes: Uint8Array, seed: number = ROUTING_SEED): number {
  const length = bytes.length;
  const tail = length & ~3;
  let h = seed | 0;
  for (let i = 0; i < tail; i += 4) {
    let k = bytes[i]! | (bytes[i + 1]! << 8) | (bytes[i + 2]! << 16) | (bytes[i + 3]! << 24);
    k = Math.imul(k, C1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, C2);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  const rest = length & 3;
  if (rest > 0) {
    let k = 0;
    if (rest === 3) k ^= bytes[tail + 2]! << 16;
    if (rest >= 2) k ^= bytes[tail + 1]! << 8;
    k ^= bytes[tail]!;
    k = Math.imul(k, C1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, C2);
    h ^= k;
  }
  h ^= length;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * The partition a routing key goes to, among `partitions` in the broker's order.
 *
 * @throws RangeError when there are no partitions.
 */
export function partitionForKey(key: string, partitions: readonly string[]): string {
  if (partitions.length === 0) throw new RangeError('a super stream has at least one partition');
  return partitions[murmur3(Buffer.from(key, 'utf8')) % partitions.length]!;
}
