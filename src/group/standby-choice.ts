/**
 * Which partitions a group member keeps a warm standby copy of (`standbyReplicas`, docs/design.md
 * §12.3): the `n` partitions it does not hold that rank highest by a hash of the member's ID and
 * the partition's name (rendezvous hashing). Members do not know each other, so the rule can only
 * promise what one member decides alone: it never tails a partition it holds (or is taking over),
 * it tails `min(n, partitions not held)` of them, and its choice depends only on its ID and the
 * set it holds (a partition it gains or loses changes its choice by at most one partition). It
 * does not promise that every partition has a standby, nor that two members pick different ones.
 */
import { createHash } from 'node:crypto';

/** A partition's rank for `memberId`: the first 8 bytes of SHA-256(member ID, NUL, partition). */
export function standbyRank(memberId: string, partition: string): bigint {
  const digest = createHash('sha256').update(memberId).update('\u0000').update(partition).digest();
  return digest.readBigUInt64BE(0);
}

/**
 * The partitions `memberId` keeps a standby copy of: of `partitions`, those not `held`, highest
 * rank first (ties by name), at most `n`. `n` 0: none.
 */
export function chooseStandbys(
  memberId: string,
  partitions: readonly string[],
  held: (partition: string) => boolean,
  n: number,
): string[] {
  if (n <= 0) return [];
  return partitions
    .filter((p) => !held(p))
    .map((p) => ({ p, rank: standbyRank(memberId, p) }))
    .sort((a, b) => (a.rank === b.rank ? (a.p < b.p ? -1 : 1) : a.rank > b.rank ? -1 : 1))
    .slice(0, n)
    .map(({ p }) => p);
}
