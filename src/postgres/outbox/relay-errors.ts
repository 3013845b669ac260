/**
 * The outbox relay's public error and counters, and which of its failures no retry fixes
 * (src/postgres/outbox/relay.ts).
 */
import { DedupError } from '../../errors.js';
import { isPermanentFailure } from '../../publisher/errors.js';
import { errorCode, refusal } from '../refusal.js';

/**
 * A row the relay cannot publish (a message over the broker's limit, headers the stream cannot
 * carry, no routing key on a super stream): the relay stops at it, never skips it. Fix or delete
 * the row (`DELETE FROM <schema>.outbox WHERE id = …`) and reopen the relay.
 *
 * @remarks Since 0.6.0
 */
export class OutboxPoisonRowError extends DedupError {
  /** The row's `outbox.id`. */
  readonly rowId: bigint;

  /** `rowId`: the row's `outbox.id`; `reason`: why it cannot be published. */
  constructor(rowId: bigint, reason: string) {
    super(
      'DEDUP_BROKER_REFUSED',
      `outbox row ${rowId} cannot be published: ${reason}; the relay stopped at it`,
    );
    this.rowId = rowId;
  }
}

/**
 * The relay's counters since `open()`.
 *
 * @remarks Since 0.6.0
 */
export interface OutboxRelayStats {
  /** Whether this relay holds the producer name (false: a standby, or stopped). */
  readonly isActive: boolean;
  /** Rows numbered and sent for the first time. */
  readonly published: number;
  /** Rows numbered by an earlier life and re-sent under their IDs on recovery. */
  readonly resent: number;
  /** Rows numbered by an earlier life that the broker already held: deleted, not re-sent. */
  readonly alreadyStored: number;
  /** Rows the broker confirmed, deleted. */
  readonly confirmed: number;
  /** Rows sent and not yet confirmed. */
  readonly inFlight: number;
  /** Age of the oldest waiting row at the last numbering, in ms (0 when none waited). */
  readonly lagMs: number;
  /** Times this relay took the name over (its first activation included). */
  readonly takeovers: number;
}

/** SQLSTATEs no retry fixes (see refusal.ts). */
const PERMANENT_SQLSTATES = new Set(['28P01', '28000', '3D000', '3F000', '42P01', '42501', '25006', '42703']);

export function isPermanent(err: unknown): boolean {
  if (isPermanentFailure(err)) return true;
  if (err instanceof DedupError) {
    return (
      err.code === 'DEDUP_STORE_REFUSED' ||
      err.code === 'DEDUP_PARTITIONS_CHANGED' ||
      err.code === 'DEDUP_SEQUENCE_REGRESSION' ||
      err.code === 'DEDUP_UNSAFE_OPTIONS' ||
      err.code === 'DEDUP_NAME_CONFLICT' ||
      err instanceof OutboxPoisonRowError
    );
  }
  const code = errorCode(err);
  return code !== undefined && PERMANENT_SQLSTATES.has(code);
}

/** A database error as the relay reports it. */
export function asReported(err: unknown, what: string): Error {
  if (err instanceof DedupError) return err;
  const code = errorCode(err);
  if (code !== undefined && PERMANENT_SQLSTATES.has(code)) return refusal(err, what);
  return err instanceof Error ? err : new Error(String(err));
}
