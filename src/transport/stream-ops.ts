/**
 * Whole-stream operations outside the publisher and the consumer: reading a stream to its end
 * (audits, the CLI, examples) and deleting one (the CLI's demo).
 */
import { Offset, type ClientParams } from 'rabbitmq-stream-js-client';
import { DedupError } from '../errors.js';
import { decodeDeliveriesOurselves } from './stream-client-internals.js';
import { resolveChunkLimits } from './stream-options.js';
import { connectStreamClient } from './stream-probe.js';
import { EndpointRotation, errorText, withTimeout, type StreamConnectionOptions } from './util.js';

/** One message read back by {@link readStreamToEnd}. */
export interface StreamRecord {
  /** The message's offset in the stream. */
  readonly offset: bigint;
  /** The message's body. */
  readonly body: Buffer;
  /** The message's application properties: where stream publishers put the identity stamps. */
  readonly applicationProperties: Readonly<Record<string, string | number>>;
  /** Where RabbitMQ 4.0 puts AMQP 0-9-1 headers named `x-…` (the identity stamps of an AMQP publisher). */
  readonly messageAnnotations: Readonly<Record<string, unknown>>;
}

/**
 * Deletes a stream, if it exists (the CLI's demo removes its own stream at the end).
 *
 * @internal
 * @throws DedupError `DEDUP_BROKER_UNREACHABLE` or `DEDUP_BROKER_REFUSED`.
 */
export async function deleteStream(connection: StreamConnectionOptions, stream: string): Promise<void> {
  const client = await connectStreamClient(new EndpointRotation(connection).next(), 10_000);
  try {
    await withTimeout(client.deleteStream({ stream }), 10_000, `deleting stream "${stream}"`);
  } catch (err) {
    throw new DedupError('DEDUP_BROKER_REFUSED', `cannot delete stream "${stream}": ${errorText(err)}`, {
      cause: err,
    });
  } finally {
    await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
  }
}

/**
 * Reads a stream from its first message (or from `options.from`) to its last committed chunk, for
 * audits and demos. Messages published after the call starts may or may not be included.
 *
 * @throws DedupError `DEDUP_BROKER_UNREACHABLE`, `DEDUP_BROKER_REFUSED` (no such stream), or
 *   `DEDUP_STREAM_UNREADABLE` (a chunk that does not decode).
 */
export async function readStreamToEnd(
  connection: StreamConnectionOptions,
  stream: string,
  options: {
    readonly timeoutMs?: number;
    /** Nothing delivered for this long after subscribing ends the read (ms). @defaultValue 2000 */
    readonly idleMs?: number;
    /**
     * What the compressed batches of one chunk may inflate to, together, in bytes (as the
     * verifying stream consumer's option). @defaultValue 16777216 (16 MiB)
     */
    readonly maxInflatedBytes?: number;
    /**
     * Where to start: an offset (messages below it are left out), or a time (the broker starts at
     * the first chunk at or after it, so a chunk's earlier messages may be in). Since 0.6.0.
     * @defaultValue the first message
     */
    readonly from?: bigint | Date;
    /**
     * Called after each message read with how many were read so far (the CLI's running count).
     * Since 0.6.0.
     */
    readonly onProgress?: (messages: number) => void;
  } = {},
): Promise<StreamRecord[]> {
  const limits = resolveChunkLimits(options.maxInflatedBytes);
  const params: ClientParams = new EndpointRotation(connection).next();
  const client = await connectStreamClient(params, 10_000);
  try {
    let last: bigint;
    try {
      last = (await client.streamStatsRequest(stream)).committedChunkId;
      // An empty stream answers -1: nothing will ever arrive.
      if (last < 0n) return [];
    } catch (err) {
      const text = errorText(err);
      // An existing stream without a committed chunk answers "no offset": it is empty.
      if (/offset/i.test(text)) return [];
      throw new DedupError('DEDUP_BROKER_REFUSED', `cannot read stream "${stream}": ${text}`, { cause: err });
    }
    const records: StreamRecord[] = [];
    const from = options.from;
    const fromOffset = typeof from === 'bigint' ? from : undefined;
    const start =
      from === undefined
        ? Offset.first()
        : typeof from === 'bigint'
          ? Offset.offset(from)
          : Offset.timestamp(from);
    const onProgress = options.onProgress;
    const timeoutMs = options.timeoutMs ?? 120_000;
    await new Promise<void>((resolve, reject) => {
      // The client misreads sub-entry batches: this client reads chunks with stream-chunks.ts
      // (docs/design.md §10), and a chunk that does not decode fails the read.
      decodeDeliveriesOurselves(
        client,
        (error) => {
          clearTimeout(timer);
          clearInterval(idle);
          reject(
            new DedupError('DEDUP_STREAM_UNREADABLE', `cannot read stream "${stream}": ${error.message}`, {
              cause: error,
            }),
          );
        },
        limits,
      );
      const timer = setTimeout(() => {
        clearInterval(idle);
        reject(
          new DedupError('DEDUP_BROKER_REFUSED', `reading "${stream}" did not finish in ${timeoutMs} ms`),
        );
      }, timeoutMs);
      // The last committed chunk may be one the broker never delivers (a tracking chunk: an offset
      // stored by a consumer after the last message), so `last` is never reached: nothing delivered
      // for idleMs after subscribing also ends the read. The broker sends what it has at once.
      const idleMs = options.idleMs ?? 2_000;
      let lastDelivery = performance.now();
      let finishing = false;
      const finish = (): void => {
        if (finishing) return;
        finishing = true;
        clearInterval(idle);
        // The rest of the last chunk is delivered before the next macrotask.
        setImmediate(() => {
          clearTimeout(timer);
          resolve();
        });
      };
      const idle = setInterval(
        () => {
          if (subscribed && performance.now() - lastDelivery >= idleMs) finish();
        },
        Math.max(10, idleMs / 4),
      );
      let subscribed = false;
      client
        .declareConsumer({ stream, offset: start }, (m) => {
          lastDelivery = performance.now();
          const offset = m.offset ?? -1n;
          // The broker sends whole chunks: the messages of the first one below `from` are not asked for.
          if (fromOffset !== undefined && offset < fromOffset) return;
          records.push({
            offset,
            body: m.content,
            applicationProperties: m.applicationProperties ?? {},
            messageAnnotations: m.messageAnnotations ?? {},
          });
          onProgress?.(records.length);
          if (offset >= last) finish();
        })
        .then(() => {
          subscribed = true;
          lastDelivery = performance.now();
        })
        .catch((err: unknown) => {
          clearTimeout(timer);
          clearInterval(idle);
          reject(
            new DedupError('DEDUP_BROKER_REFUSED', `cannot consume "${stream}": ${errorText(err)}`, {
              cause: err,
            }),
          );
        });
    });
    return records;
  } finally {
    await withTimeout(client.close(), 5_000, 'closing').catch(() => undefined);
  }
}
