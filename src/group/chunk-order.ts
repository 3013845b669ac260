/**
 * Stream order for a subscription with several chunks of credit in flight (the changelog
 * restore). rabbitmq-stream-js-client 1.0 hands each Deliver frame to an async loop that awaits
 * every message's handler: two frames that arrive together run their loops at once, and their
 * messages reach the handler interleaved (measured for the stream consumer: 927 of 100 000 out of
 * order with more than one credit). Here messages are held until no chunk is half delivered — every
 * chunk the client began is complete — and then released in offset order. A chunk that arrives
 * later lies wholly after them: the broker sends chunks in stream order.
 *
 * @internal
 */
import { messageBytes, type StreamMessage } from '../transport/stream-delivery.js';

/** @internal */
export class ChunkOrder {
  #queue: StreamMessage[] = [];
  #head = 0;
  /** Messages before this index are from complete chunks, in offset order. */
  #ready = 0;
  /** Chunks the client began handing over and has not finished. */
  #open = 0;
  /** Bytes of the messages received and not yet taken (body, headers and annotations: messageBytes). */
  #bytes = 0;

  /** The client began a chunk (its credit policy's `onChunkReceived`). */
  chunkStarted(): void {
    this.#open++;
  }

  /** A message of an open chunk. */
  push(message: StreamMessage): void {
    this.#queue.push(message);
    this.#bytes += messageBytes(message);
  }

  /**
   * The client finished a chunk (`onChunkCompleted`). Returns true when that released messages:
   * no chunk is open any more.
   */
  chunkCompleted(): boolean {
    if (this.#open > 0) this.#open--;
    if (this.#open > 0 || this.#ready === this.#queue.length) return false;
    // Insertion sort of what arrived since the last release: nearly in order already.
    const q = this.#queue;
    for (let i = this.#ready + 1; i < q.length; i++) {
      const m = q[i]!;
      const offset = m.offset ?? -1n;
      let j = i;
      while (j > this.#ready && (q[j - 1]!.offset ?? -1n) > offset) {
        q[j] = q[j - 1]!;
        j--;
      }
      q[j] = m;
    }
    this.#ready = q.length;
    return true;
  }

  /** The next message in stream order, or `undefined` until more is released. */
  next(): StreamMessage | undefined {
    if (this.#head >= this.#ready) return undefined;
    const message = this.#queue[this.#head++]!;
    this.#bytes -= messageBytes(message);
    // Drop what was taken, now and then: a long restore would otherwise keep every entry.
    if (this.#head >= 1_024 && this.#head * 2 >= this.#queue.length) {
      this.#queue = this.#queue.slice(this.#head);
      this.#ready -= this.#head;
      this.#head = 0;
    }
    return message;
  }

  /** Chunks begun and not finished: while any is, nothing more is released. */
  get openChunks(): number {
    return this.#open;
  }

  /** Messages received and not yet taken (released or not). */
  get waiting(): number {
    return this.#queue.length - this.#head;
  }

  /** Bytes of those messages (messageBytes): what the read-ahead holds, whatever the entries hold. */
  get waitingBytes(): number {
    return this.#bytes;
  }
}
