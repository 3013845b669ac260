/**
 * The publisher's typed errors and what they tell the caller: each says what happened to the
 * message (sent or not, kept in the outbox or not) and what to do.
 */
import { DedupError } from '../errors.js';
import type { Durability } from './types.js';

const PERMANENT = new WeakSet<Error>();

/**
 * Marks a transport's connect failure that no retry can fix (the stream was deleted): a publisher
 * reconnecting stops with it at once instead of retrying for `giveUpAfterMs`.
 */
export function permanentFailure(err: DedupError): DedupError {
  PERMANENT.add(err);
  return err;
}

/** Whether {@link permanentFailure} marked `err`. */
export function isPermanentFailure(err: unknown): err is DedupError {
  return err instanceof Error && PERMANENT.has(err);
}

/**
 * The target (a stream, or an AMQP queue) was deleted while the publisher was open: a permanent
 * failure, so that the reconnect loop stops at once.
 */
export function targetDeletedError(
  what: 'stream' | 'queue',
  target: string,
  producerName: string,
  cause: unknown,
): DedupError {
  return permanentFailure(
    new DedupError(
      'DEDUP_BROKER_REFUSED',
      `${what} "${target}" no longer exists (deleted while producer "${producerName}" was open); ` +
        `stopped; the outbox keeps what it holds`,
      { cause },
    ),
  );
}

/** `err` as a DedupError: itself when it is one, else wrapped with `code` and `message`. */
export function asDedupError(err: unknown, code: DedupError['code'], message: string): DedupError {
  if (err instanceof DedupError) return err;
  return new DedupError(code, `${message}: ${errorText(err)}`, { cause: err });
}

/** A store write during open(): its failure as the typed error the publisher reports for one. */
export async function storeWrite<T>(write: Promise<T>): Promise<T> {
  try {
    return await write;
  } catch (err) {
    throw asDedupError(err, 'DEDUP_STORE_CORRUPT', 'writing the store failed');
  }
}

export function abortError(signal: AbortSignal): DedupError {
  return new DedupError('DEDUP_ABORTED', 'the wait was aborted; the message may still be published', {
    cause: signal.reason,
  });
}

export function closedError(producerName: string): DedupError {
  return new DedupError('DEDUP_PUBLISHER_CLOSED', `publisher "${producerName}" is closed; nothing was sent`);
}

/** For sends `close()` found neither written nor sent. */
export function closedUnwrittenError(producerName: string): DedupError {
  return new DedupError(
    'DEDUP_PUBLISHER_CLOSED',
    `publisher "${producerName}" closed before this message was written or sent: nothing was sent, ` +
      `and nothing will re-send it`,
  );
}

/** For sends `close()` found sent and unconfirmed. */
export function closedUnconfirmedError(producerName: string, durability: Durability): DedupError {
  return new DedupError(
    'DEDUP_PUBLISHER_CLOSED',
    durability === 'outbox'
      ? `publisher "${producerName}" closed before the broker confirmed this message; it stays in the ` +
          `outbox and is re-sent with its ID by the next open() of this producer`
      : `publisher "${producerName}" closed before the broker confirmed this message; with reserve ` +
          `durability it is not re-sent: it may or may not be in the stream`,
  );
}

export function confirmTimeoutError(
  producerName: string,
  publishingId: bigint,
  timeoutMs: number,
): DedupError {
  return new DedupError(
    'DEDUP_CONFIRM_TIMEOUT',
    `publishing ID ${publishingId} of producer "${producerName}" was not confirmed within ` +
      `${timeoutMs} ms. It stays in the outbox and is re-sent with the same ID; ` +
      `do not send it again yourself (a new send gets a new ID).`,
  );
}

export function nameConflictError(
  producerName: string,
  target: string,
  brokerLast: bigint,
  ceiling: bigint,
): DedupError {
  return new DedupError(
    'DEDUP_NAME_CONFLICT',
    `the broker's last publishing ID for producer "${producerName}" on "${target}" is ${brokerLast}, ` +
      `above the ${ceiling} this publisher handed out or reserved: another writer publishes under this name, and the ` +
      `broker drops whichever of the two is behind. Stopped; unconfirmed messages stay in the outbox.`,
  );
}

export function unreachableError(giveUpAfterMs: number, inFlight: number, lastError: unknown): DedupError {
  return new DedupError(
    'DEDUP_BROKER_UNREACHABLE',
    `no connection to the broker for ${Math.round(giveUpAfterMs / 1000)} s; ` +
      `${inFlight} unconfirmed messages stay in the outbox for the next open(). ` +
      `Last attempt: ${errorText(lastError)}`,
    { cause: lastError },
  );
}

/** A broken invariant: the publisher stops with an error its callers see. */
/**
 * A broken invariant a transport detects on the way out (a sub-entry batch handed over in part):
 * the publisher stops with {@link internalError} rather than reconnect and send the same again.
 */
export class InvariantError extends Error {}

export function internalError(producerName: string, err: unknown): DedupError {
  return new DedupError(
    'DEDUP_PUBLISHER_CLOSED',
    `publisher "${producerName}" stopped on an internal error (please report it): ${errorText(err)}`,
    { cause: err },
  );
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
