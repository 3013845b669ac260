import type { AuditRecord } from '../../src/cli/audit.js';
import { AMQP091_TRANSPORT, identityHeaders, TRANSPORT_HEADER } from '../../src/identity/headers.js';

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

/**
 * {@link records} as an AMQP 0-9-1 publisher writes them (since 0.6.0): stamps and the
 * `x-dedup-transport: amqp091` mark in the message annotations, where RabbitMQ 4 puts `x-` headers.
 */
export function amqpRecords(...messages: Array<readonly [string, number]>): AuditRecord[] {
  return messages.map((m, i) => ({
    offset: BigInt(i),
    applicationProperties: {},
    messageAnnotations: { ...identityHeaders(m[0], BigInt(m[1])), [TRANSPORT_HEADER]: AMQP091_TRANSPORT },
  }));
}
