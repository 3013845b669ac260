/**
 * `stream-dedup audit --from OFFSET | --since TIME`: an audit of a range of the stream, its parsing
 * and how reports name it. Pure.
 */

/**
 * Where an audit started when not at the first message (`--from <offset>`, `--since <time>`).
 * A range cannot see the IDs before it: a copy of an earlier message is not a duplicate there,
 * and each producer's gaps are counted from its first ID in the range.
 */
export type AuditRange = { readonly from: bigint } | { readonly since: Date };

/** `from offset 100` or `since 2026-12-03T10:00:00.000Z`. */
export function describeRange(range: AuditRange): string {
  return 'from' in range ? `from offset ${range.from}` : `since ${range.since.toISOString()}`;
}

/** The line that says what a range cannot see. */
export const RANGE_NOTE: string =
  'a range: messages before it are not read, so a copy of one of them is not counted as a duplicate, ' +
  "and each producer's gaps and order are checked from its first id in the range";

/** The JSON fields of a range: `from` (an offset, as a string) and `since` (ISO time), null when unset. */
export function rangeJson(range: AuditRange | undefined): { from: bigint | null; since: string | null } {
  return {
    from: range !== undefined && 'from' in range ? range.from : null,
    since: range !== undefined && 'since' in range ? range.since.toISOString() : null,
  };
}

/**
 * `--from OFFSET` / `--since TIME` as an audit range, `undefined` for neither, or what is wrong
 * with them (a usage error).
 */
export function parseAuditRange(
  from: string | boolean | undefined,
  since: string | boolean | undefined,
): AuditRange | undefined | string {
  if (typeof from === 'string' && typeof since === 'string') return '--from and --since exclude each other';
  if (typeof from === 'string') {
    // Decimal digits only: BigInt() would also take '0x10', ' 7 ' and ''.
    if (!/^(0|[1-9]\d{0,19})$/.test(from) || BigInt(from) > 0xffff_ffff_ffff_ffffn) {
      return `--from expects an offset, a decimal integer from 0 to 2^64 - 1, got ${JSON.stringify(from)}`;
    }
    return { from: BigInt(from) };
  }
  if (typeof since === 'string') {
    // An ISO 8601 date or date-time (Date.parse alone takes many other spellings).
    const ms = /^\d{4}-\d{2}-\d{2}([T ][\d:.]+(Z|[+-]\d{2}:?\d{2})?)?$/.test(since) ? Date.parse(since) : NaN;
    if (!Number.isFinite(ms) || ms < 0) {
      return `--since expects an ISO 8601 time such as 2026-12-03T10:00:00Z, got ${JSON.stringify(since)}`;
    }
    return { since: new Date(ms) };
  }
  return undefined;
}
