import { producerNameProblem } from './producer-name.js';
import { parsePublishingId } from './publishing-id.js';

/** Header (application property) that carries the producer name. */
export const PRODUCER_HEADER = 'x-dedup-producer';
/** Header (application property) that carries the publishing ID as a decimal string. */
export const ID_HEADER = 'x-dedup-id';
/**
 * Header on the first message after a deliberate skip of IDs: the first skipped ID, as a decimal
 * string. The producer declares that, of the IDs from there up to this message's ID minus one,
 * those missing from the stream carry no message whose `send()` resolved: a skip, not a loss.
 *
 * @remarks Since 0.2.0
 */
export const SKIP_HEADER = 'x-dedup-skip-from';

/**
 * Header that the AMQP 0-9-1 publisher adds to every message, with the value
 * {@link AMQP091_TRANSPORT}: the broker does not deduplicate AMQP 0-9-1, so after a crash the
 * outbox's re-sends may be copies in the stream, and `stream-dedup audit` counts copies carrying
 * it as expected copies rather than duplicates. Stream-protocol publishers do not add it.
 *
 * @internal The CLI's audit reads it; the `x-dedup-` prefix is reserved, so callers cannot set it.
 */
export const TRANSPORT_HEADER = 'x-dedup-transport';
/** The value of {@link TRANSPORT_HEADER} on messages of the AMQP 0-9-1 publisher. @internal */
export const AMQP091_TRANSPORT = 'amqp091';

/** The identity a publisher stamps into every message. */
export interface MessageIdentity {
  /** The producer's stable name (`x-dedup-producer`). */
  readonly producerName: string;
  /** The message's publishing ID (`x-dedup-id`), from 1 to 2^64 - 1. */
  readonly publishingId: bigint;
  /**
   * Set on the first message after a deliberate skip (see {@link SKIP_HEADER}): the IDs from here
   * to `publishingId - 1` were never used for an acknowledged message. Missing IDs there are a
   * declared skip, not a loss.
   */
  readonly skippedFrom?: bigint;
}

/** What {@link readIdentity} found in a message's headers. */
export type IdentityReading =
  | {
      /** Both stamps are there and valid. */
      readonly kind: 'ok';
      /** The producer name and publishing ID they carry. */
      readonly identity: MessageIdentity;
    }
  | {
      /** Neither stamp is there: a message of another writer. */
      readonly kind: 'missing';
    }
  | {
      /** A stamp is there but not valid (one without the other, a malformed ID or name). */
      readonly kind: 'malformed';
      /** What is wrong with it, for a log line. */
      readonly reason: string;
    };

/**
 * The two headers for a message. Values are decimal strings: only strings survive every path
 * (an AMQP 0-9-1 header of another type may not cross into a stream consumer, docs/design.md §3).
 */
export function identityHeaders(producerName: string, publishingId: bigint): Record<string, string> {
  return { [PRODUCER_HEADER]: producerName, [ID_HEADER]: publishingId.toString() };
}

/** The last producer name that passed `producerNameProblem`. */
let lastCheckedName = '';

/**
 * Reads the identity stamped by a stream-dedup publisher. Never throws: a message with neither
 * header is `missing`, one with a single header or a value of the wrong type or form is
 * `malformed`, with the reason.
 *
 * Pass every place the headers may be, in order: the first that holds either header is read.
 * Over the stream protocol, a stream publisher's stamps are application properties, but AMQP
 * 0-9-1 headers whose names start with `x-` arrive as message annotations (RabbitMQ 4.0), so a
 * stream consumer reads `readIdentity(m.applicationProperties, m.messageAnnotations)`. An AMQP
 * 0-9-1 consumer reads `readIdentity(msg.properties.headers)`.
 *
 * @example
 * ```ts
 * const r = readIdentity(message.applicationProperties, message.messageAnnotations);
 * if (r.kind === 'ok') console.log(r.identity.producerName, r.identity.publishingId);
 * ```
 */
export function readIdentity(
  ...sources: ReadonlyArray<Readonly<Record<string, unknown>> | undefined | null>
): IdentityReading {
  const headers = sources.find(holdsIdentity);
  if (headers === undefined || headers === null) return { kind: 'missing' };
  const identity = parseIdentity(headers);
  return typeof identity === 'string' ? { kind: 'malformed', reason: identity } : { kind: 'ok', identity };
}

/**
 * Whether `headers` holds either identity header.
 * @internal The verifying consumer's per-message path (no result wrapper); applications use `readIdentity`.
 */
export function holdsIdentity(
  headers: Readonly<Record<string, unknown>> | undefined | null,
): headers is Readonly<Record<string, unknown>> {
  return (
    headers !== undefined &&
    headers !== null &&
    typeof headers === 'object' &&
    (Object.hasOwn(headers, PRODUCER_HEADER) || Object.hasOwn(headers, ID_HEADER))
  );
}

/**
 * The identity in headers that hold at least one of its headers, or the reason it is malformed.
 * @internal See `holdsIdentity`.
 */
export function parseIdentity(headers: Readonly<Record<string, unknown>>): MessageIdentity | string {
  const name = Object.hasOwn(headers, PRODUCER_HEADER) ? headers[PRODUCER_HEADER] : undefined;
  const id = Object.hasOwn(headers, ID_HEADER) ? headers[ID_HEADER] : undefined;
  if (typeof name !== 'string' || name.length === 0) {
    return `${PRODUCER_HEADER} must be a non-empty string, got ${
      Buffer.isBuffer(name) ? 'bytes that are not UTF-8' : describe(name)
    }`;
  }
  // Consecutive messages mostly come from one producer: its name is checked once. A name the
  // publisher would refuse is malformed: it could merge with another (a lossy decoder, UTF-8 on
  // disk) or break the scope key (a lone surrogate), and it must never make process() throw.
  if (name !== lastCheckedName) {
    const problem = producerNameProblem(name);
    if (problem !== undefined) return `${PRODUCER_HEADER} ${problem}`;
  }
  lastCheckedName = name;
  const text = Buffer.isBuffer(id) ? id.toString('utf8') : id;
  if (typeof text !== 'string') {
    return `${ID_HEADER} must be a decimal string, got ${describe(id)}`;
  }
  const publishingId = parsePublishingId(text);
  if (publishingId === undefined) {
    return `${ID_HEADER} must be a decimal from 1 to 2^64 - 1, got ${JSON.stringify(text.slice(0, 40))}`;
  }
  if (!Object.hasOwn(headers, SKIP_HEADER)) return { producerName: name, publishingId };
  const skip = headers[SKIP_HEADER];
  const skipText = Buffer.isBuffer(skip) ? skip.toString('utf8') : skip;
  const skippedFrom = typeof skipText === 'string' ? parsePublishingId(skipText) : undefined;
  if (skippedFrom === undefined || skippedFrom >= publishingId) {
    return `${SKIP_HEADER} must be a decimal from 1 to the message's ID - 1, got ${
      typeof skipText === 'string' ? JSON.stringify(skipText.slice(0, 40)) : describe(skip)
    }`;
  }
  return { producerName: name, publishingId, skippedFrom };
}

function describe(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  return typeof value;
}
