/**
 * A loopback TCP proxy in front of the stream port that forwards every frame except Publish frames
 * (key 0x0002), which it drops after reading their publishing IDs. A producer behind it completes
 * the handshake, declares itself, queries its last ID and heartbeats as usual, but the broker never
 * sees a message, so nothing is confirmed. bench/recover.ts uses it to fill a publisher's outbox
 * with messages that are committed and never confirmed: the publisher writes each group commit
 * before its messages leave (docs/design.md §4.2), so a Publish frame seen here proves the IDs in
 * it are in the store.
 *
 * test/support/proxy.ts (the fault tests' proxy) can stall a connection, but stalling drops every
 * frame in both directions, heartbeats included; this one reads the frames to drop only Publish.
 */
import net from 'node:net';

/** Stream protocol: u32 size, then u16 key, u16 version. Publish is key 2. */
const PUBLISH_KEY = 0x0002;
/** Sub-entry batch: the entry type byte after the publishing ID has its top bit set. */
const SUB_ENTRY_FLAG = 0x80;

export class PublishDroppingProxy {
  readonly #server: net.Server;
  readonly #sockets = new Set<net.Socket>();
  /** Publish frames dropped. */
  frames = 0;
  /** Entries (messages, or sub-entry batches) in the dropped frames. */
  entries = 0;
  /** The highest publishing ID in a dropped frame (0n before the first). */
  highestId = 0n;
  readonly #waiters: Array<{ id: bigint; resolve: () => void }> = [];

  private constructor(targetHost: string, targetPort: number) {
    this.#server = net.createServer((client) => this.#accept(client, targetHost, targetPort));
  }

  /** Listens on an ephemeral port of 127.0.0.1 and forwards to `targetHost:targetPort`. */
  static async start(targetHost: string, targetPort: number): Promise<PublishDroppingProxy> {
    const proxy = new PublishDroppingProxy(targetHost, targetPort);
    await new Promise<void>((resolve) => proxy.#server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port(): number {
    return (this.#server.address() as net.AddressInfo).port;
  }

  /**
   * Resolves once a dropped Publish frame carried `id` or a higher one; rejects after `timeoutMs`
   * with what was seen so far.
   */
  waitForId(id: bigint, timeoutMs: number): Promise<void> {
    if (this.highestId >= id) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(
          new Error(
            `the proxy saw publishing IDs up to ${this.highestId} (${this.entries} entries in ${this.frames} frames), not ${id}, within ${timeoutMs} ms`,
          ),
        );
      }, timeoutMs);
      this.#waiters.push({
        id,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      });
    });
  }

  #accept(client: net.Socket, host: string, port: number): void {
    const upstream = net.connect({ host, port });
    this.#sockets.add(client).add(upstream);
    // Broker to client: everything, as it comes.
    upstream.on('data', (chunk: Buffer) => client.write(chunk));
    // Client to broker: whole frames, Publish frames dropped.
    let pending: Buffer = Buffer.alloc(0);
    client.on('data', (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      let o = 0;
      while (pending.length - o >= 4) {
        const end = o + 4 + pending.readUInt32BE(o);
        if (pending.length < end) break;
        if (pending.readUInt16BE(o + 4) === PUBLISH_KEY) this.#dropped(pending, o + 4, end);
        else upstream.write(pending.subarray(o, end));
        o = end;
      }
      pending = o === pending.length ? Buffer.alloc(0) : pending.subarray(o);
    });
    const close = (): void => {
      client.destroy();
      upstream.destroy();
      this.#sockets.delete(client);
      this.#sockets.delete(upstream);
    };
    client.on('close', close).on('error', close);
    upstream.on('close', close).on('error', close);
  }

  /** Reads the publishing IDs of the Publish frame `frame[start..end)` (after its size). */
  #dropped(frame: Buffer, start: number, end: number): void {
    // key u16, version u16, publisher id u8, entry count u32.
    let o = start + 5;
    const count = frame.readUInt32BE(o);
    o += 4;
    for (let i = 0; i < count && o < end; i++) {
      const id = frame.readBigUInt64BE(o);
      o += 8;
      if ((frame[o]! & SUB_ENTRY_FLAG) !== 0) {
        // Entry type u8, record count u16, uncompressed length u32, data length u32, data.
        o += 1 + 2 + 4 + 4 + frame.readUInt32BE(o + 7);
      } else {
        o += 4 + frame.readUInt32BE(o);
      }
      if (id > this.highestId) this.highestId = id;
    }
    this.frames++;
    this.entries += count;
    for (let i = this.#waiters.length - 1; i >= 0; i--) {
      const waiter = this.#waiters[i]!;
      if (this.highestId >= waiter.id) {
        this.#waiters.splice(i, 1);
        waiter.resolve();
      }
    }
  }

  /** Closes every connection and stops listening. */
  async close(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    this.#sockets.clear();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
