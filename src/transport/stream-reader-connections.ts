/**
 * AUDIT THIS FILE WHEN UPGRADING rabbitmq-stream-js-client (with stream-client-internals.ts).
 *
 * A reader client that keeps its subscription connections between reads. rabbitmq-stream-js-client
 * 1.0 opens a connection for each stream a client subscribes to (its pool's key is the stream, the
 * virtual host, the node and the kind) and closes it with the stream's last subscription: a standby
 * tail reading k changelogs every 250 ms opened and closed a connection per read — 4k a second.
 * Measured (RabbitMQ 4.3.6 on this machine, load 4–6): a subscribe + unsubscribe on a client already
 * connected took 54 ms (median of 20) with the client's own connection per read, 3 ms on a kept one.
 *
 * Reaches into (1.0): `client.pool.getConnection` / `releaseConnection`, `client.declareConsumer` /
 * `closeConsumer` / `close`; a connection's `connectionClosedListener`, `consumerId`, `refCount`,
 * `decrRefCount()`, `ready`, `close()`, `socket`; a consumer's `connection`. Not part of the public API.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { MAX_IDS_PER_CONNECTION } from './stream-client-internals.js';
import { withTimeout } from './util.js';

/** What is used of a client connection. */
interface ReaderConnection {
  readonly refCount: number;
  readonly ready: boolean;
  readonly consumerId: number;
  connectionClosedListener?: (hadError: boolean) => void;
  decrRefCount(): number;
  close(params?: { closingCode: number; closingReason: string; manuallyClose?: boolean }): Promise<void>;
  readonly socket?: { destroy(): void };
}

interface PoolShape {
  getConnection(
    entityType: string,
    streamName: string,
    vhost: string,
    host: string,
    create: () => Promise<unknown>,
  ): Promise<unknown>;
  releaseConnection(connection: unknown, manuallyClose?: boolean): Promise<void>;
}

/** One kept connection of a node. */
interface Kept {
  readonly connection: ReaderConnection;
  /** Each live subscription's `connectionClosedListener`, by its extended ID. */
  readonly listeners: Map<string, (hadError: boolean) => void>;
  /** Handed out for a subscription (its ID is taken after the hand-out). */
  handouts: number;
  /** Closed, or replaced: never handed out again; closed once its last subscription ends. */
  retired: boolean;
  closing: Promise<void> | undefined;
}

/** How long closing one kept connection may take before its socket is destroyed. */
const CLOSE_TIMEOUT_MS = 5_000;

const keptClients = new WeakSet<object>();

function unsupported(): DedupError {
  return new DedupError(
    'DEDUP_BROKER_REFUSED',
    "this rabbitmq-stream-js-client version does not expose the client's connection pool, through " +
      'which stream-dedup keeps reader connections; use the 1.0.x line pinned in package.json',
  );
}

/**
 * Makes `client` keep one subscription connection per node (and virtual host), shared by every
 * stream it reads, open between reads: a read subscribes and unsubscribes on it without a
 * connection of its own. A kept connection is replaced once it has issued
 * {@link MAX_IDS_PER_CONNECTION} subscription IDs (the client never reuses one, and the broker
 * refuses the 257th) or once it closed. Each subscription's `connectionClosedListener` hears the
 * close of its connection, whichever subscription opened it (the client calls only the first's).
 * `client.close()` closes the kept connections too, each within 5 s (then its socket is destroyed).
 * Publishers are untouched. Idempotent. For the library's own reader clients only.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` when this client version has no such pool.
 */
export function keepReaderConnections(client: Client): void {
  const c = client as unknown as {
    pool?: Partial<PoolShape>;
    declareConsumer: Client['declareConsumer'];
    closeConsumer: Client['closeConsumer'];
    close: Client['close'];
  };
  const pool = c.pool;
  if (typeof pool?.getConnection !== 'function' || typeof pool.releaseConnection !== 'function')
    throw unsupported();
  if (keptClients.has(client)) return;
  keptClients.add(client);
  const p = pool as PoolShape;
  const current = new Map<string, Kept>();
  const all = new Set<Kept>();
  const byConnection = new WeakMap<object, Kept>();

  const closeKept = (kept: Kept): Promise<void> => {
    kept.retired = true;
    all.delete(kept);
    // A connection already closed (the broker went away) is not asked: its socket goes.
    if (!kept.connection.ready) kept.connection.socket?.destroy();
    kept.closing ??= !kept.connection.ready
      ? Promise.resolve()
      : withTimeout(
          kept.connection.close({ closingCode: 0, closingReason: '', manuallyClose: true }),
          CLOSE_TIMEOUT_MS,
          'closing a reader connection',
        )
          .catch(() => kept.connection.socket?.destroy())
          .then(() => undefined);
    return kept.closing;
  };
  const retire = (node: string, kept: Kept): void => {
    if (current.get(node) === kept) current.delete(node);
    kept.retired = true;
    if (kept.connection.refCount <= 0) void closeKept(kept);
  };

  const getConnection = p.getConnection.bind(p);
  p.getConnection = async (entityType, streamName, vhost, host, create) => {
    if (entityType === 'publisher') return getConnection(entityType, streamName, vhost, host, create);
    const node = `${vhost}@${host}`;
    const kept = current.get(node);
    if (kept !== undefined) {
      const used = Math.max(kept.handouts, kept.connection.consumerId);
      if (!kept.retired && kept.connection.ready && used < MAX_IDS_PER_CONNECTION) {
        kept.handouts = used + 1;
        return kept.connection;
      }
      retire(node, kept);
    }
    const connection = (await create()) as ReaderConnection;
    const made: Kept = { connection, listeners: new Map(), handouts: 1, retired: false, closing: undefined };
    connection.connectionClosedListener = (hadError) => {
      retire(node, made);
      for (const listener of [...made.listeners.values()]) listener(hadError);
    };
    // Two reads that connected at once: the later one is kept, the earlier retires when unused.
    const before = current.get(node);
    if (before !== undefined) retire(node, before);
    current.set(node, made);
    all.add(made);
    byConnection.set(connection, made);
    return connection;
  };

  const releaseConnection = p.releaseConnection.bind(p);
  p.releaseConnection = async (connection, manuallyClose) => {
    const kept =
      typeof connection === 'object' && connection !== null ? byConnection.get(connection) : undefined;
    if (kept === undefined) return releaseConnection(connection, manuallyClose);
    kept.connection.decrRefCount();
    if (kept.retired && kept.connection.refCount <= 0) await closeKept(kept);
  };

  const declareConsumer = c.declareConsumer.bind(client);
  c.declareConsumer = async (params, handle, superStream) => {
    const consumer = await declareConsumer(params, handle, superStream);
    const connection = (consumer as unknown as { connection?: unknown }).connection;
    const kept =
      typeof connection === 'object' && connection !== null ? byConnection.get(connection) : undefined;
    const listener = params.connectionClosedListener;
    if (kept !== undefined && listener !== undefined) {
      // Closed while the subscription was being made: its listener was not registered yet.
      if (kept.retired && !kept.connection.ready) queueMicrotask(() => listener(true));
      else kept.listeners.set(consumer.extendedId, listener);
    }
    return consumer;
  };
  const closeConsumer = c.closeConsumer.bind(client);
  c.closeConsumer = (extendedId) => {
    for (const kept of all) kept.listeners.delete(extendedId);
    return closeConsumer(extendedId);
  };
  const close = c.close.bind(client);
  c.close = async (params?: Parameters<Client['close']>[0]) => {
    // In parallel: a locator connection that does not answer must not keep the kept ones open.
    await Promise.all([close(params), ...[...all].map(closeKept)]);
  };
}
