/**
 * A super stream's partitions: discovered from the broker at open, checked against the list the
 * store recorded at the last open, and (for `routing.kind: 'key'`) the broker's route query with
 * a cache. Not part of the public API.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import type { DedupStore } from '../store/store.js';
import { Backoff, sleep } from '../util/backoff.js';
import { connectStreamClient } from '../transport/stream-probe.js';
import {
  EndpointRotation,
  errorText,
  isStreamClient,
  openThroughEndpoints,
  withTimeout,
  type StreamConnectionOptions,
} from '../transport/util.js';

/** Stream protocol response code 2: the stream (here: the super stream's exchange) does not exist. */
const DOES_NOT_EXIST = 2;

/** The response code in the client's "… returned error with code N …" messages, if there is one. */
function responseCode(err: unknown): number | undefined {
  const m = err instanceof Error ? /returned error with code (\d+)/.exec(err.message) : null;
  return m === null ? undefined : Number(m[1]);
}

/**
 * The connection that asks the broker about a super stream: the application's `Client`, or one
 * of our own, connected on first use and replaced after a failure that was not the broker's
 * answer (a lost connection, a timeout), so that a later query connects again.
 *
 * @internal
 */
export class Locator {
  readonly #shared: Client | undefined;
  readonly #endpoints: EndpointRotation | undefined;
  readonly #timeoutMs: number;
  readonly #retry: RouteRetry | undefined;
  #own: Promise<Client> | undefined;
  #closed = false;
  /** Ends a retry's backoff wait early (close()). */
  #wake: (() => void) | undefined;

  /**
   * `retry`: how route queries ride out a lost connection (backoff, then give up), as the
   * partitions' publishers ride out theirs; without it a query is tried on one new connection.
   */
  constructor(
    connection: StreamConnectionOptions | Client | undefined,
    timeoutMs: number,
    retry?: RouteRetry,
  ) {
    this.#shared = isStreamClient(connection) ? connection : undefined;
    this.#endpoints = isStreamClient(connection) ? undefined : new EndpointRotation(connection ?? {});
    this.#timeoutMs = timeoutMs;
    this.#retry = retry;
  }

  /**
   * The super stream's partitions, in the broker's order (its bindings' partition order).
   *
   * @throws DedupError `DEDUP_BROKER_REFUSED` when the super stream does not exist or has no
   *   partition; `DEDUP_BROKER_UNREACHABLE` when the broker cannot be reached.
   */
  async partitions(superStream: string): Promise<string[]> {
    const what = `querying the partitions of super stream "${superStream}"`;
    let streams: string[];
    try {
      streams = await this.#query(what, (c) => c.queryPartitions({ superStream }));
    } catch (err) {
      if (responseCode(err) === DOES_NOT_EXIST) {
        throw new DedupError(
          'DEDUP_BROKER_REFUSED',
          `super stream "${superStream}" does not exist (the broker's partitions query answered "stream does not exist")`,
          { cause: err },
        );
      }
      throw err;
    }
    if (streams.length === 0) {
      throw new DedupError('DEDUP_BROKER_REFUSED', `super stream "${superStream}" has no partitions`);
    }
    return streams;
  }

  /**
   * Which of `streams` the broker's metadata answers for with a leader (response code 1, OK). A
   * stream that does not exist (2), one the user may not see (16) or one without a leader right
   * now is not in the set.
   *
   * @throws DedupError `DEDUP_BROKER_REFUSED` or `DEDUP_BROKER_UNREACHABLE`.
   */
  async existing(streams: readonly string[]): Promise<Set<string>> {
    const answers = await this.#query(`querying the metadata of ${streams.length} streams`, (c) =>
      c.queryMetadata({ streams: [...streams] }),
    );
    return new Set(
      answers.filter((a) => a.responseCode === 1 && a.leader !== undefined).map((a) => a.streamName),
    );
  }

  /**
   * The streams the super stream's bindings route `routingKey` to (the broker's route query).
   *
   * @throws DedupError `DEDUP_BROKER_REFUSED` or `DEDUP_BROKER_UNREACHABLE`.
   */
  route(superStream: string, routingKey: string): Promise<string[]> {
    return this.#query(
      `routing key "${routingKey}" on super stream "${superStream}"`,
      (c) => c.routeQuery({ superStream, routingKey }),
      this.#retry,
    );
  }

  /**
   * Closes our own connection, if there is one, for good: a later query is refused. The
   * application's `Client` stays open. Idempotent.
   */
  async close(): Promise<void> {
    this.#closed = true;
    this.#wake?.();
    await this.#drop();
  }

  /**
   * Closes our own connection (only if it is still `used`, when given: a query that failed on an
   * older connection must not close the one a retry opened since); the next query opens another.
   */
  async #drop(used?: Client): Promise<void> {
    const own = this.#own;
    if (own === undefined) return;
    if (used !== undefined && (await own.catch(() => undefined)) !== used) return;
    if (this.#own !== own) return;
    this.#own = undefined;
    const client = await own.catch(() => undefined);
    await withTimeout(client?.close() ?? Promise.resolve(), 5_000, 'closing the client').catch(
      () => undefined,
    );
  }

  async #query<T>(what: string, ask: (client: Client) => Promise<T>, retry?: RouteRetry): Promise<T> {
    // Our own connection may have died since the last query (a broker restart): try again on a
    // new one — once, or with `retry` until its giveUpAfterMs. The application's Client is the
    // application's to restart.
    const started = performance.now();
    const backoff = retry === undefined ? undefined : new Backoff(retry);
    for (let attempt = 1; ; attempt++) {
      let client: Client | undefined;
      try {
        client = this.#shared ?? (await this.#connect());
        return await withTimeout(ask(client), this.#timeoutMs, what);
      } catch (err) {
        if (responseCode(err) !== undefined) {
          throw new DedupError('DEDUP_BROKER_REFUSED', `the broker refused ${what}: ${errorText(err)}`, {
            cause: err,
          });
        }
        // A refusal (credentials, permissions) is not a lost connection: no retry helps.
        if (err instanceof DedupError && err.code === 'DEDUP_BROKER_REFUSED') throw err;
        if (this.#closed || this.#shared !== undefined) throw unreachable(what, err);
        if (client !== undefined) await this.#drop(client);
        const retrying = retry !== undefined && performance.now() - started < retry.giveUpAfterMs;
        if (attempt >= 2 && !retrying) throw unreachable(what, err);
        if (attempt >= 2) await sleep(backoff!.next(), (wake) => (this.#wake = wake));
        this.#wake = undefined;
      }
    }
  }

  #connect(): Promise<Client> {
    // After close() nothing may open a connection that nobody would close.
    if (this.#closed) {
      return Promise.reject(
        new DedupError('DEDUP_PUBLISHER_CLOSED', 'the publisher is closed; nothing was sent'),
      );
    }
    const endpoints = this.#endpoints!;
    const connecting = (this.#own ??= openThroughEndpoints(endpoints.size, () =>
      connectStreamClient(endpoints.next(), this.#timeoutMs),
    ));
    // A failed connect is not kept: the next query tries again.
    connecting.catch(() => {
      if (this.#own === connecting) this.#own = undefined;
    });
    return connecting;
  }
}

/** How route queries retry: the publishers' reconnect options. */
export interface RouteRetry {
  readonly initialDelayMs: number;
  readonly maxDelayMs: number;
  readonly giveUpAfterMs: number;
}

function unreachable(what: string, err: unknown): DedupError {
  if (err instanceof DedupError && err.code !== 'DEDUP_BROKER_UNREACHABLE') return err;
  return new DedupError('DEDUP_BROKER_UNREACHABLE', `${what} failed: ${errorText(err)}`, { cause: err });
}

/**
 * Compares the partitions found with those the store recorded at the producer's last open, and
 * records them at its first.
 *
 * @throws DedupError `DEDUP_PARTITIONS_CHANGED` when they differ (count, names or order);
 *   `DEDUP_STORE_CORRUPT`, `DEDUP_STORE_CLOSED` from the store.
 * @internal
 */
export async function checkRecordedPartitions(
  store: DedupStore,
  superStream: string,
  producerName: string,
  partitions: readonly string[],
): Promise<void> {
  const recorded = await store.readPartitions(superStream, producerName);
  if (recorded === undefined) {
    await store.writePartitions(superStream, producerName, partitions);
    return;
  }
  if (recorded.length === partitions.length && recorded.every((p, i) => p === partitions[i])) return;
  throw new DedupError(
    'DEDUP_PARTITIONS_CHANGED',
    `super stream "${superStream}" has ${partitions.length} partitions [${partitions.join(', ')}], but producer ` +
      `"${producerName}" first opened it with ${recorded.length} [${recorded.join(', ')}] (the store's record): ` +
      `routing would move keys to other partitions, away from their IDs, outboxes and keys. ` +
      `Re-partitioning is not supported; nothing was sent`,
  );
}

/** Routing keys whose partition is remembered (`routing.kind: 'key'`); beyond it the oldest go. */
const ROUTE_CACHE_SIZE = 10_000;

/**
 * The partition of a routing key through the super stream's bindings, cached: one route query
 * per routing key (concurrent sends of a key share one), as the stream clients do.
 *
 * @internal
 */
export class KeyRoutes {
  readonly #locator: Locator;
  readonly #superStream: string;
  readonly #partitions: ReadonlySet<string>;
  readonly #cache = new Map<string, string>();
  readonly #asking = new Map<string, Promise<string>>();

  constructor(locator: Locator, superStream: string, partitions: readonly string[]) {
    this.#locator = locator;
    this.#superStream = superStream;
    this.#partitions = new Set(partitions);
  }

  /** The cached partition of `routingKey`, or the route query's answer. */
  partitionOf(routingKey: string): string | Promise<string> {
    return this.#cache.get(routingKey) ?? this.#asking.get(routingKey) ?? this.#ask(routingKey);
  }

  #ask(routingKey: string): Promise<string> {
    const asking = this.#lookup(routingKey).finally(() => this.#asking.delete(routingKey));
    this.#asking.set(routingKey, asking);
    return asking;
  }

  async #lookup(routingKey: string): Promise<string> {
    const streams = await this.#locator.route(this.#superStream, routingKey);
    if (streams.length === 0) {
      throw new DedupError(
        'DEDUP_BROKER_REFUSED',
        `no binding of super stream "${this.#superStream}" matches routing key "${routingKey}"; nothing was sent`,
      );
    }
    // The first of the streams that is a partition, as the JavaScript client chooses.
    const partition = streams.find((s) => this.#partitions.has(s));
    if (partition === undefined) {
      throw new DedupError(
        'DEDUP_PARTITIONS_CHANGED',
        `super stream "${this.#superStream}" routes key "${routingKey}" to [${streams.join(', ')}], none of ` +
          `the partitions found at open ([${[...this.#partitions].join(', ')}]); nothing was sent`,
      );
    }
    if (this.#cache.size >= ROUTE_CACHE_SIZE) this.#cache.delete(this.#cache.keys().next().value!);
    this.#cache.set(routingKey, partition);
    return partition;
  }
}
