/**
 * Stream deliveries to a verifying consumer core, in stream order, one at a time: processed right
 * in the client's callback while nothing waits, buffered and drained in order once a message waits
 * (an async handler, a scope load, a commit), with the credit held back while the buffer is full.
 * Used by the stream consumer and by each partition of a consumer group. Not part of the public API.
 */
import type { Client, ClientParams } from 'rabbitmq-stream-js-client';
import type { Generation } from '../consumer/resubscribe.js';
import { metadataUpdateStream } from './stream-client-internals.js';
import { connectStreamClient } from './stream-probe.js';
import type { IncomingMessage } from '../consumer/types.js';

/** Delivered messages waiting for the handler above which no chunk is asked for… */
const BUFFER_HIGH = 20_000;
/** …and below which one is asked for again. */
const BUFFER_LOW = 5_000;
/**
 * Bytes of delivered messages waiting for the handler ({@link messageBytes}: the body and the
 * decoded sections) at or above which no chunk is asked for; one is again below a quarter of it.
 * The message bound alone let 20 000 gzip'd 1 MiB messages (20 GB) be read ahead of a handler
 * that waits; counting bodies only let 20 000 empty-bodied messages with a 1 MiB application
 * property (20 GiB of strings) through (review B, M4). One chunk is in flight at a time, so
 * the buffer holds at most this plus one chunk; a chunk larger than the bound is still asked for
 * once the buffer is below a quarter of it, so every message is delivered.
 *
 * @internal
 */
export const BUFFER_BYTES = 32 * 1024 * 1024;
/** Processed messages at the head of the buffer that make it worth copying the rest down. */
const COMPACT_AT = 1_024;

/**
 * What a delivered message holds, as the read-ahead counts it: its body's bytes, and its decoded
 * sections (application properties, message annotations, properties, header) walked as the chunk
 * decoder's memory property counts them — 8 bytes per value (its slot), a Buffer's length, 2 per
 * UTF-16 code unit of strings and of map keys. An estimate of the heap they take, not the encoded
 * size: a string of N ASCII bytes from the wire counts 2N. The sections are trees nested at most
 * 32 deep (the decoder refuses deeper), so the walk is bounded by the values the chunk decoder
 * was allowed to make; it runs only for a message that is buffered.
 *
 * @internal
 */
export function messageBytes(message: StreamMessage | IncomingMessage): number {
  const m = message as Partial<StreamMessage> & IncomingMessage;
  return (
    m.content.length +
    valueBytes(m.applicationProperties) +
    valueBytes(m.messageAnnotations) +
    valueBytes(m.messageProperties) +
    valueBytes(m.messageHeader)
  );
}

function valueBytes(value: unknown): number {
  if (typeof value === 'string') return 8 + 2 * value.length;
  if (typeof value !== 'object' || value === null) return 8;
  if (value instanceof Uint8Array) return 8 + value.length;
  if (value instanceof Date) return 8;
  let bytes = 8;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) bytes += valueBytes(value[i]);
    return bytes;
  }
  // Indexed loops: ~350 ns for a message with five header values, where for…of took ~500.
  const keys = Object.keys(value);
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i]!;
    bytes += 2 * key.length + valueBytes((value as Record<string, unknown>)[key]);
  }
  return bytes;
}

/** @internal */
export type StreamMessage = Parameters<Parameters<Client['declareConsumer']>[1]>[0];
/** @internal */
export type ConsumerCreditPolicy = NonNullable<Parameters<Client['declareConsumer']>[0]['creditPolicy']>;

/**
 * Connects the client of one subscription attempt to `stream` and hands it to `generation`: a
 * closed connection, a leader change or a deleted stream (a metadata update for it) end the
 * generation, and the consumer subscribes again through whichever node answers.
 *
 * @internal
 */
export async function connectSubscriber(
  params: ClientParams,
  stream: string,
  generation: Generation<Client>,
  timeoutMs: number,
): Promise<Client> {
  const client = await connectStreamClient(
    {
      ...params,
      listeners: {
        connection_closed: () => generation.lost(),
        metadata_update: (update) => {
          if (metadataUpdateStream(update) === stream) generation.lost();
        },
      },
    },
    timeoutMs,
  );
  generation.opened(client);
  return client;
}

/**
 * Asks the broker for `howMany` more chunks.
 *
 * @internal
 */
export type CreditRequest = (howMany: number) => Promise<void>;

/**
 * A subscription's credit policy: `initialCredits` chunks at subscription (one by default, as the
 * JS client's own policies), then whatever `onChunkCompleted` grants: that many chunks in flight.
 * With more than one, messages of two chunks can reach the handler interleaved (`ChunkOrder`);
 * `onChunkReceived` is told when the client begins a chunk.
 *
 * @internal
 */
export function creditPolicyOf(
  onChunkCompleted: (request: CreditRequest) => Promise<void>,
  initialCredits = 1,
  onChunkReceived?: () => void,
): ConsumerCreditPolicy {
  return {
    onSubscription: () => initialCredits,
    onChunkReceived:
      onChunkReceived === undefined
        ? () => Promise.resolve()
        : () => {
            onChunkReceived();
            return Promise.resolve();
          },
    onChunkCompleted,
    requestCredits: (request: CreditRequest, howMany: number) => request(howMany),
  } as unknown as ConsumerCreditPolicy;
}

/**
 * Where the deliveries go.
 *
 * @internal
 */
export interface DeliveryTarget {
  /** Verifies and applies one message (`VerifyingConsumerCore.process`); may throw. */
  process(message: IncomingMessage): Promise<void> | undefined;
  /** The target stopped (its core failed): deliveries are dropped. */
  readonly stopped: boolean;
  /** Stops the consumer with `error` (a handler threw, a write failed). */
  stop(error: Error): void;
  /** Runs `task` after the tasks queued before it (the subscription's serial queue). */
  enqueue(task: () => Promise<void>): void;
}

/**
 * The ordered delivery of one subscription generation after another.
 *
 * @internal
 */
export class OrderedDelivery {
  readonly #target: DeliveryTarget;
  /**
   * Delivered by the current subscription, not yet processed, in stream order (read from #head
   * on). Emptied whenever the generation moves on, so everything in it is of the current one.
   */
  #buffer: IncomingMessage[] = [];
  #head = 0;
  /** {@link messageBytes} of each message in #buffer, at the same index (counted once, at push). */
  #sizes: number[] = [];
  /** Their sum from #head on. */
  #bytes = 0;
  readonly #bufferBytes: number;
  #draining = false;
  /** A credit the client asked for while the buffer was full: granted once the drain catches up. */
  #heldCredit: (() => void) | undefined;

  /** `bufferBytes`: the read-ahead's bound in {@link messageBytes} (tests lower it). */
  constructor(target: DeliveryTarget, bufferBytes = BUFFER_BYTES) {
    this.#target = target;
    this.#bufferBytes = bufferBytes;
  }

  /** Messages delivered that wait for the handler (bounded by 20 000 plus one chunk). */
  get buffered(): number {
    return this.#draining ? this.#buffer.length - this.#head : 0;
  }

  /** Their {@link messageBytes} (bounded by {@link BUFFER_BYTES} plus one chunk). */
  get bufferedBytes(): number {
    return this.#draining ? this.#bytes : 0;
  }

  /**
   * The client's delivery callback (`isCurrent`: the message's subscription is still the current
   * one): never throws, never waits. The client may deliver two chunks at once, and an exception
   * here would be unhandled: process right here while nothing waits (the common, synchronous
   * case); otherwise buffer, and drain one at a time in order. Failures become a stop.
   */
  deliver(isCurrent: () => boolean, message: StreamMessage): void {
    if (!isCurrent()) return;
    // The client's message is the core's IncomingMessage as it is (no wrapper per message);
    // deliveries always carry their offset.
    const item = message as IncomingMessage;
    if (item.offset === undefined) {
      this.#target.stop(new Error('the stream client delivered a message without an offset'));
      return;
    }
    if (this.#draining) {
      const size = messageBytes(item);
      this.#buffer.push(item);
      this.#sizes.push(size);
      this.#bytes += size;
      return;
    }
    if (this.#target.stopped) return;
    let pending: Promise<void> | undefined;
    try {
      pending = this.#target.process(item);
    } catch (err) {
      this.#target.stop(asError(err));
      return;
    }
    if (pending !== undefined) {
      this.#draining = true;
      this.#target.enqueue(async () => {
        try {
          await pending;
        } catch (err) {
          this.#target.stop(asError(err));
          this.clear();
          this.#draining = false;
          return;
        }
        await this.#drain();
      });
    }
  }

  /** Drops what older subscription generations delivered and is still buffered (never processed). */
  clear(): void {
    this.#buffer = [];
    this.#sizes = [];
    this.#head = 0;
    this.#bytes = 0;
  }

  /**
   * This delivery is done (its partition moved away): what it buffered is dropped, and a credit
   * it held back is granted, for whatever delivers next on the same subscription.
   */
  release(): void {
    this.clear();
    this.#grantHeldCredit();
  }

  /** A new subscription starts: a credit held for an older one is forgotten. */
  reset(): void {
    this.#heldCredit = undefined;
  }

  /**
   * One chunk of credit at a time, as in the client's default policy: with more credit the client
   * runs two chunks' deliveries at once and interleaves their messages (measured: 927 of 100 000
   * then fell outside a 1024 window as stale), and the verifier needs stream order. The credit is
   * held back while more than {@link BUFFER_HIGH} delivered messages, or {@link BUFFER_BYTES} of
   * them ({@link messageBytes}), wait for an asynchronous handler: without that the client reads the stream into memory far ahead of a slow handler
   * (measured: 35 000 messages ahead on a loaded 3-node cluster).
   */
  creditPolicy(isCurrent: () => boolean): ConsumerCreditPolicy {
    return creditPolicyOf((request) => this.onChunkCompleted(isCurrent, request));
  }

  /**
   * A chunk of the subscription was delivered: asks for the next one now, or holds the credit
   * back while the buffer is full (see {@link OrderedDelivery.creditPolicy}).
   */
  onChunkCompleted(isCurrent: () => boolean, request: CreditRequest): Promise<void> {
    if (!isCurrent()) return Promise.resolve();
    const grant = (): void => void request(1).catch(() => undefined);
    if (
      !this.#draining ||
      (this.#buffer.length - this.#head < BUFFER_HIGH && this.#bytes < this.#bufferBytes)
    )
      grant();
    else this.#heldCredit = grant;
    return Promise.resolve();
  }

  async #drain(): Promise<void> {
    try {
      while (this.#head < this.#buffer.length) {
        this.#bytes -= this.#sizes[this.#head]!;
        const item = this.#buffer[this.#head++]!;
        // Asked for again once the handler has caught up (checked after the take, so a buffer of
        // one message larger than the bound asks for the next chunk while that message runs).
        if (
          this.#heldCredit !== undefined &&
          this.#buffer.length - this.#head < BUFFER_LOW &&
          this.#bytes < this.#bufferBytes / 4
        ) {
          this.#grantHeldCredit();
        }
        // Drop what was processed: in a long drain the array would otherwise keep every message
        // of it alive (measured: 59 000 at once, promoted and collected the expensive way).
        if (this.#head >= COMPACT_AT && this.#head * 2 >= this.#buffer.length) {
          this.#buffer = this.#buffer.slice(this.#head);
          this.#sizes = this.#sizes.slice(this.#head);
          this.#head = 0;
        }
        if (this.#target.stopped) continue;
        try {
          const pending = this.#target.process(item);
          if (pending !== undefined) await pending;
        } catch (err) {
          this.#target.stop(asError(err));
          break;
        }
      }
    } finally {
      this.clear();
      this.#draining = false;
      this.#grantHeldCredit();
    }
  }

  #grantHeldCredit(): void {
    const grant = this.#heldCredit;
    this.#heldCredit = undefined;
    grant?.();
  }
}

function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}
