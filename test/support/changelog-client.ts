import type { Client } from 'rabbitmq-stream-js-client';
import { ID_HEADER, PRODUCER_HEADER } from '../../src/identity/headers.js';
import { changelogPositionKey, decodeOffset } from '../../src/store/consumer-keys.js';
import type { KeyValueDb } from '../../src/store/store.js';

// A changelog as the restore sees it through the stream client (for the unit and property tests of
// src/group/restore.ts): the last-ID query, the stream's stats and a subscription that delivers one
// chunk per credit as the client does (onChunkReceived, the messages, onChunkCompleted), and a
// key-value store whose writes take as long as a test says. It measures what the restore holds:
// content bytes delivered and not yet written to the store (the changelog position says how far).

/** One record of the changelog: its writer, its publishing ID and its content (made when delivered). */
export interface ChangelogRecordSpec {
  readonly producer: string;
  readonly id: bigint;
  readonly content: () => Buffer;
  /** More application properties (the writer's settings). */
  readonly headers?: Readonly<Record<string, string>>;
}

interface Policy {
  onSubscription(): number;
  onChunkReceived(): Promise<void>;
  onChunkCompleted(request: (credits: number) => Promise<void>): Promise<void>;
}

export class FakeChangelog {
  readonly #records: readonly ChangelogRecordSpec[];
  /** Content bytes of each delivered offset, until the store has it. */
  readonly #held = new Map<number, number>();
  #heldBytes = 0;
  /** The most bytes delivered and not yet in the store at any moment. */
  peakHeldBytes = 0;
  /** The largest chunk delivered, in content bytes. */
  largestChunkBytes = 0;
  readonly #chunkSize: (index: number) => number;
  readonly #storeDelayMs: (write: number) => number;
  #writes = 0;
  readonly #kv = new Map<string, Uint8Array>();
  #closed = false;
  /** The offset stored under the snapshot reference, if any. */
  reference: bigint | undefined;
  /** The first offset retention kept: records before it are gone (set by a test). */
  firstChunkId = 0n;

  constructor(
    records: readonly ChangelogRecordSpec[],
    options: { chunkSize?: (index: number) => number; storeDelayMs?: (write: number) => number } = {},
  ) {
    this.#records = records;
    this.#chunkSize = options.chunkSize ?? (() => 1);
    this.#storeDelayMs = options.storeDelayMs ?? (() => 0);
  }

  /** The stream client, as far as the restore uses it. */
  client(): Client {
    const records = this.#records;
    const fake = {
      getConnection: () => Promise.resolve({}),
      locatorConnection: {
        queryPublisherSequence: ({ publisherRef }: { publisherRef: string }) =>
          Promise.resolve(
            records.reduce((max, r) => (r.producer === publisherRef && r.id > max ? r.id : max), 0n),
          ),
      },
      // The snapshot reference (the broker's offset tracking): set by a test.
      queryOffset: () =>
        this.reference === undefined
          ? Promise.reject(new Error('no offset stored (code 19)'))
          : Promise.resolve(this.reference),
      streamStatsRequest: () =>
        Promise.resolve({ firstChunkId: this.firstChunkId, committedChunkId: BigInt(records.length - 1) }),
      declareConsumer: (
        params: { offset: { value?: bigint }; creditPolicy?: Policy },
        handler: (message: unknown) => void,
      ) => {
        this.#closed = false; // one subscription at a time (a restore that falls back subscribes again)
        const from = params.offset.value ?? 0n;
        this.#deliver(
          Number(from > this.firstChunkId ? from : this.firstChunkId),
          params.creditPolicy,
          handler,
        );
        return Promise.resolve({ extendedId: 'fake-consumer' });
      },
      closeConsumer: () => {
        this.#closed = true;
        return Promise.resolve(true);
      },
    };
    return fake as unknown as Client;
  }

  #deliver(from: number, policy: Policy | undefined, handler: (message: unknown) => void): void {
    let credits = policy?.onSubscription() ?? Infinity;
    let next = from;
    let chunk = 0;
    let pumping = false;
    const pump = async (): Promise<void> => {
      if (pumping) return;
      pumping = true;
      while (credits > 0 && next < this.#records.length && !this.#closed) {
        credits--;
        const end = Math.min(this.#records.length, next + Math.max(1, this.#chunkSize(chunk++)));
        // As the client: one chunk per socket read, a macrotask apart.
        await new Promise((resolve) => setImmediate(resolve));
        await policy?.onChunkReceived();
        let chunkBytes = 0;
        for (let offset = next; offset < end; offset++) {
          const record = this.#records[offset]!;
          const content = record.content();
          chunkBytes += content.length;
          this.#held.set(offset, content.length);
          this.#heldBytes += content.length;
          handler({
            content,
            offset: BigInt(offset),
            applicationProperties: {
              ...record.headers,
              [PRODUCER_HEADER]: record.producer,
              [ID_HEADER]: record.id.toString(),
            },
          });
        }
        this.peakHeldBytes = Math.max(this.peakHeldBytes, this.#heldBytes);
        this.largestChunkBytes = Math.max(this.largestChunkBytes, chunkBytes);
        next = end;
        await policy?.onChunkCompleted((n) => {
          credits += n;
          void pump();
          return Promise.resolve();
        });
      }
      pumping = false;
    };
    void pump();
  }

  /** The member's store: writes take `storeDelayMs(write)`; the changelog position frees what it covers. */
  db(namespace: string): KeyValueDb {
    const kv = this.#kv;
    const positionKey = changelogPositionKey(namespace);
    return {
      status: 'open',
      open: () => Promise.resolve(),
      close: () => Promise.resolve(),
      get: (key) => Promise.resolve(kv.get(key)),
      batch: async (ops) => {
        const delay = this.#storeDelayMs(this.#writes++);
        if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
        for (const op of ops) {
          if (op.type === 'put') kv.set(op.key, op.value);
          else kv.delete(op.key);
          if (op.type === 'put' && op.key === positionKey) this.#free(op.value);
        }
      },
      // The keys of a range, sorted (a snapshot restore clears the namespace; the snapshot writer reads it).
      iterator: ({ gte, lt }) => {
        const entries = [...kv].filter(([k]) => k >= gte && k < lt).sort(([a], [b]) => (a < b ? -1 : 1));
        const it = entries[Symbol.iterator]();
        const iterator = {
          next: () => Promise.resolve(it.next()),
          close: () => Promise.resolve(),
          [Symbol.asyncIterator]: () => iterator,
        };
        return iterator as ReturnType<KeyValueDb['iterator']>;
      },
    };
  }

  /** Offsets below the written changelog position are in the store: no longer held. */
  #free(value: Uint8Array): void {
    const position = Number(decodeOffset(value));
    for (const [offset, bytes] of this.#held) {
      if (offset < position) {
        this.#held.delete(offset);
        this.#heldBytes -= bytes;
      }
    }
  }
}
