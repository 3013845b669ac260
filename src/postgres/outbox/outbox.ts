/**
 * `PgOutbox`: the application's half of the transactional outbox (docs/design.md §14). `enqueue`
 * inserts a message into the outbox table with the caller's own client, inside the caller's
 * transaction: the relay publishes it once that transaction commits, never if it rolls back.
 */
import { assertProducerName } from '../../identity/producer-name.js';
import { measureUtf8 } from '../../identity/utf8.js';
import { assertBody, assertFits, assertKey, stampBytesOf, validateHeaders } from '../../publisher/message.js';
import type { Headers } from '../../store/codec.js';
import { expectObject, expectOptionalObject, integerOption } from '../../util/options.js';
import { checkSchemaName } from '../schema.js';
import { outboxTablesOf } from '../outbox-tables.js';

/**
 * The largest message `enqueue` accepts by default, in bytes (body, headers and the identity
 * stamps): the broker's default frame size (`stream.frame_max`, 1 MiB) less the 512 bytes the
 * stream transport keeps for the publish frame. A row the relay finds larger than its broker's
 * actual limit stops the relay (`DEDUP_BROKER_REFUSED` naming the row).
 *
 * @remarks Since 0.6.0
 */
export const OUTBOX_MAX_MESSAGE_BYTES: number = 1_048_576 - 512;

/**
 * What `enqueue` needs of a client: a `pg` `Client` or `PoolClient` (or anything with its
 * `query(text, values)`), in the caller's transaction.
 *
 * @remarks Since 0.6.0
 */
export interface OutboxClient {
  /** Runs one statement with its parameters (`pg`'s `client.query(text, values)`). */
  query(
    text: string,
    values?: unknown[],
  ): Promise<{
    /** The statement's result rows. */
    rows: unknown[];
  }>;
}

/**
 * Options of {@link PgOutbox.create}.
 *
 * @remarks Since 0.6.0
 */
export interface PgOutboxOptions {
  /** The schema `migrate()` created (`^[a-z_][a-z0-9_]*$`, at most 63 bytes). */
  readonly schema: string;
  /**
   * The producer name of the relay that publishes these rows (`PgOutboxRelay.open`'s
   * `producerName`). 1 to 256 UTF-8 bytes, no control characters.
   */
  readonly producerName: string;
  /**
   * The largest message accepted, in bytes: body + headers + identity stamps (an upper bound of
   * what the stream transport writes). Raise it only with the broker's `stream.frame_max`.
   * @defaultValue {@link OUTBOX_MAX_MESSAGE_BYTES} (1 048 064)
   */
  readonly maxMessageBytes?: number;
}

/**
 * Options of {@link PgOutbox.enqueue}.
 *
 * @remarks Since 0.6.0
 */
export interface EnqueueOptions {
  /**
   * The message's domain key (at most 512 UTF-8 bytes, no lone surrogate, no U+0000). On a super
   * stream it routes the row (unless `routingKey` is given). Stored in `outbox.message_key`.
   * @defaultValue none: the row has no key (on a super stream it then needs `routingKey`)
   */
  readonly key?: string;
  /**
   * Application properties, as `send()` takes them (strings, non-zero 32-bit integers).
   * @defaultValue none: only the identity stamps
   */
  readonly headers?: Readonly<Record<string, string | number>>;
  /**
   * The super stream routing key, when it is not `key` (same bounds as `key`).
   * @defaultValue `key`
   */
  readonly routingKey?: string;
}

/**
 * What {@link PgOutbox.enqueue} inserted.
 *
 * @remarks Since 0.6.0
 */
export interface EnqueueResult {
  /** The row's `outbox.id` (orders rows within one relay read only; not the publishing ID). */
  readonly id: bigint;
}

/**
 * One message of {@link PgOutbox.enqueueMany}: its body and `enqueue`'s options.
 *
 * @remarks Since 0.6.0
 */
export interface EnqueueItem extends EnqueueOptions {
  /** The message body. */
  readonly body: Uint8Array;
}

/**
 * The most body bytes one {@link PgOutbox.enqueueMany} call takes (64 MiB): its bodies travel as
 * one bytea array literal, hex-encoded, twice their size in the driver's memory. Split a larger set
 * over several calls in the same transaction.
 *
 * @remarks Since 0.6.0
 */
export const OUTBOX_ENQUEUE_MANY_BYTES: number = 64 * 1024 * 1024;

/** PostgreSQL text and jsonb cannot hold U+0000 (the server refuses the row). */
function assertNoNul(value: string, what: string): void {
  if (value.includes('\u0000'))
    throw new RangeError(`${what} must not contain U+0000 (PostgreSQL text cannot hold it)`);
}

/** Checks a key or routing key: what `assertKey` checks, plus no U+0000. */
function checkKey(value: unknown, name: string): string | undefined {
  if (value === undefined) return undefined;
  try {
    assertKey(value);
  } catch (err) {
    const E = err instanceof TypeError ? TypeError : RangeError;
    throw new E((err as Error).message.replace('options.key', `options.${name}`));
  }
  assertNoNul(value, `options.${name}`);
  return value;
}

/** The headers as jsonb text, refusing what jsonb or the stream cannot carry. */
function encodeHeaders(headers: Headers | undefined): string | null {
  if (headers === undefined) return null;
  for (const [k, v] of Object.entries(headers)) {
    for (const [text, what] of [
      [k, `header name ${JSON.stringify(k)}`],
      [typeof v === 'string' ? v : '', `header ${JSON.stringify(k)}`],
    ] as const) {
      assertNoNul(text, what);
      // jsonb refuses a lone surrogate (and UTF-8 cannot carry it).
      if (measureUtf8(text).loneSurrogate)
        throw new RangeError(`${what} must not contain a lone UTF-16 surrogate`);
    }
  }
  return JSON.stringify(headers);
}

/**
 * The application's handle on the outbox of one producer name: {@link PgOutbox.enqueue} in the
 * application's transactions. Holds no connection; create one per producer name and reuse it.
 *
 * @example
 * ```ts
 * const outbox = PgOutbox.create({ schema: 'stream_dedup', producerName: 'orders-svc' });
 * // Once, where the pool is made: pg gives a checked-out client no 'error' listener, and a server
 * // going away while one is held would crash the process.
 * pool.on('connect', (c) => c.on('error', (err) => console.error('PostgreSQL:', err.message)));
 * const client = await pool.connect();
 * try {
 *   await client.query('BEGIN');
 *   await client.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [17, 42]);
 *   await outbox.enqueue(client, Buffer.from('{"order":17}'), { key: 'order-17' });
 *   await client.query('COMMIT');
 * } catch (err) {
 *   await client.query('ROLLBACK');
 *   throw err;
 * } finally {
 *   client.release();
 * }
 * ```
 * @remarks Since 0.6.0
 */
export class PgOutbox {
  /** The schema the rows go to. */
  readonly schema: string;
  /** The producer name whose relay publishes the rows. */
  readonly producerName: string;
  /** The largest message accepted, in bytes. */
  readonly maxMessageBytes: number;
  readonly #insert: string;
  readonly #insertMany: string;
  readonly #stampBytes: number;

  private constructor(schema: string, producerName: string, maxMessageBytes: number) {
    this.schema = schema;
    this.producerName = producerName;
    this.maxMessageBytes = maxMessageBytes;
    this.#stampBytes = stampBytesOf(producerName);
    this.#insert =
      `INSERT INTO ${outboxTablesOf(schema).outbox} (producer_name, body, message_key, routing_key, headers) ` +
      'VALUES ($1, $2, $3, $4, $5::jsonb) RETURNING id';
    // Ordered by the item's position, so the rows' ids (taken as the rows are inserted) ascend in
    // the items' order: the relay reads, numbers and publishes them in that order.
    this.#insertMany =
      `INSERT INTO ${outboxTablesOf(schema).outbox} (producer_name, body, message_key, routing_key, headers) ` +
      'SELECT $1, u.body, u.message_key, u.routing_key, u.headers ' +
      'FROM unnest($2::bytea[], $3::text[], $4::text[], $5::jsonb[]) WITH ORDINALITY ' +
      'AS u(body, message_key, routing_key, headers, n) ORDER BY u.n RETURNING id';
  }

  /**
   * Checks the options (no I/O: the schema is checked by the relay and by the INSERT itself).
   *
   * @throws TypeError, RangeError for a bad schema name, producer name or size.
   */
  static create(options: PgOutboxOptions): PgOutbox {
    expectObject(options, 'options');
    const schema = checkSchemaName(options.schema);
    assertProducerName(options.producerName);
    const max = integerOption(options.maxMessageBytes, 'maxMessageBytes', OUTBOX_MAX_MESSAGE_BYTES, 1);
    return new PgOutbox(schema, options.producerName, max);
  }

  /**
   * Inserts `body` into the outbox with `client`, in whatever transaction `client` is in (the
   * caller's: BEGIN … COMMIT around it). Everything is checked before the INSERT: a message the
   * relay could not publish is refused here, not found later.
   *
   * @throws TypeError, RangeError for a body that is not bytes, a message over `maxMessageBytes`, a
   *   key, routing key or header the broker or PostgreSQL cannot carry (U+0000, a lone surrogate,
   *   a reserved `x-dedup-` header, an empty string or a number that is not a non-zero 32-bit
   *   integer), before any I/O.
   * @throws the driver's error when the INSERT fails (for example a missing outbox table: run
   *   `migrate()`); the caller's transaction is then aborted, as with any failed statement.
   */
  async enqueue(
    client: OutboxClient,
    body: Uint8Array,
    options: EnqueueOptions = {},
  ): Promise<EnqueueResult> {
    if (typeof client?.query !== 'function') throw new TypeError('client must be a pg Client or PoolClient');
    const row = this.#checked(body, options);
    const result = await client.query(this.#insert, [this.producerName, ...row]);
    const inserted = result.rows[0] as { id: string | number | bigint } | undefined;
    if (inserted === undefined) throw new Error('the outbox INSERT returned no row');
    return { id: BigInt(inserted.id) };
  }

  /**
   * Inserts every item into the outbox with ONE statement on `client`, in whatever transaction
   * `client` is in (the caller's), as {@link PgOutbox.enqueue} would insert each: one round trip
   * for many rows (an application committing thousands of rows a second needs it). Every item is
   * checked as `enqueue` checks it before anything is sent; one refusal and nothing is inserted.
   * The rows' ids ascend in the items' order, so the relay publishes them in that order. An empty
   * array inserts nothing and sends nothing.
   *
   * @returns the rows' ids, in the items' order.
   * @throws TypeError, RangeError for `items` not an array, or bodies over
   *   {@link OUTBOX_ENQUEUE_MANY_BYTES} in all; and for an item `enqueue` would refuse, its message
   *   starting `items[<index>]: ` (the first refused item), before any I/O.
   * @throws the driver's error when the INSERT fails; the caller's transaction is then aborted.
   * @remarks Since 0.6.0
   */
  async enqueueMany(client: OutboxClient, items: readonly EnqueueItem[]): Promise<EnqueueResult[]> {
    if (typeof client?.query !== 'function') throw new TypeError('client must be a pg Client or PoolClient');
    if (!Array.isArray(items))
      throw new TypeError('items must be an array of { body, key?, headers?, routingKey? }');
    const bodies: Buffer[] = [];
    const keys: (string | null)[] = [];
    const routingKeys: (string | null)[] = [];
    const headers: (string | null)[] = [];
    let bytes = 0;
    for (let i = 0; i < items.length; i++) {
      const item: unknown = items[i];
      try {
        expectObject(item, 'the item');
        const { body, ...options } = item as unknown as EnqueueItem;
        const [b, key, routingKey, encoded] = this.#checked(body, options);
        bodies.push(b);
        keys.push(key);
        routingKeys.push(routingKey);
        headers.push(encoded);
        bytes += b.length;
      } catch (err) {
        const E = err instanceof TypeError ? TypeError : RangeError;
        throw new E(`items[${i}]: ${(err as Error).message}`, { cause: err });
      }
      if (bytes > OUTBOX_ENQUEUE_MANY_BYTES) {
        throw new RangeError(
          `items hold more than ${OUTBOX_ENQUEUE_MANY_BYTES} body bytes (at items[${i}]): split them over several enqueueMany calls`,
        );
      }
    }
    if (bodies.length === 0) return [];
    const result = await client.query(this.#insertMany, [
      this.producerName,
      bodies,
      keys,
      routingKeys,
      headers,
    ]);
    if (result.rows.length !== bodies.length) {
      throw new Error(`the outbox INSERT returned ${result.rows.length} rows for ${bodies.length} items`);
    }
    // Ascending: the ids were taken in the items' order (the statement's ORDER BY).
    const ids = result.rows.map((r) => BigInt((r as { id: string | number | bigint }).id));
    ids.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    return ids.map((id) => ({ id }));
  }

  /** One message checked as `enqueue` checks it: its INSERT values after the producer name. */
  #checked(
    body: Uint8Array,
    options: EnqueueOptions | undefined,
  ): [Buffer, string | null, string | null, string | null] {
    assertBody(body);
    expectOptionalObject(options, 'options');
    const opts: EnqueueOptions = options ?? {};
    const key = checkKey(opts.key, 'key');
    const routingKey = checkKey(opts.routingKey, 'routingKey');
    const headers = validateHeaders(opts.headers);
    const encoded = encodeHeaders(headers);
    assertFits(body, headers, this.#stampBytes, this.maxMessageBytes);
    return [
      Buffer.from(body.buffer, body.byteOffset, body.byteLength),
      key ?? null,
      routingKey ?? null,
      encoded,
    ];
  }
}
