import type { AuditRecord } from '../../src/cli/audit.js';
import { identityHeaders } from '../../src/identity/headers.js';

/** Stream records, offsets 0, 1, 2, … in the order given: `[producer, id]` or `undefined` for no identity. */
export function records(...messages: Array<readonly [string, number] | undefined>): AuditRecord[] {
  return messages.map((m, i) => ({
    offset: BigInt(i),
    applicationProperties: m === undefined ? { other: 'x' } : identityHeaders(m[0], BigInt(m[1])),
    messageAnnotations: {},
  }));
}

/** `[producer, id]` pairs for {@link records}. */
export const ids = (producer: string, ...xs: number[]): Array<readonly [string, number]> =>
  xs.map((x) => [producer, x] as const);
