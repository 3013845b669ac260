import net from 'node:net';
import { BROKER } from './broker.js';

/**
 * A bare stream-protocol connection for measuring broker limits: frames written as they are on the
 * wire (no client library choosing IDs, pooling connections or splitting frames), so a test sees
 * exactly what the broker answers to a frame the libraries would never send.
 */
export class RawStreamConnection {
  readonly #socket: net.Socket;
  #buffer = Buffer.alloc(0);
  #correlation = 0;
  readonly #waiting = new Map<number, (frame: Buffer) => void>();
  /** Server-initiated frames (key → frames), for publish confirms and errors. */
  readonly #listeners = new Set<(key: number, body: Buffer) => void>();
  #closedBy: string | undefined;
  /** The frame size the broker tuned to. */
  frameMax = 0;

  private constructor(socket: net.Socket) {
    this.#socket = socket;
    socket.on('data', (chunk: Buffer) => this.#read(chunk));
    socket.on('close', () => (this.#closedBy ??= 'socket closed'));
    socket.on('error', () => undefined);
  }

  /** Whether the broker closed the connection (a close frame or the socket), and how. */
  get closed(): string | undefined {
    return this.#closedBy;
  }

  static async open(): Promise<RawStreamConnection> {
    const socket = net.connect({ host: BROKER.host, port: BROKER.streamPort });
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    const c = new RawStreamConnection(socket);
    const tuned = new Promise<Buffer>((resolve) => {
      const listener = (key: number, body: Buffer): void => {
        if (key !== 0x0014) return;
        c.#listeners.delete(listener);
        resolve(body);
      };
      c.#listeners.add(listener);
    });
    await c.request(0x0011, u32(0)); // peer properties: none
    await c.request(0x0012, Buffer.alloc(0)); // SASL handshake
    const plain = Buffer.from(`\0${BROKER.username}\0${BROKER.password}`);
    expectOk(await c.request(0x0013, Buffer.concat([str('PLAIN'), u32(plain.length), plain])), 'SASL');
    const tune = await tuned;
    c.frameMax = tune.readUInt32BE(0);
    c.#write(frame(0x0014, Buffer.concat([u32(c.frameMax), u32(0)])));
    expectOk(await c.request(0x0015, str(BROKER.vhost)), 'open');
    return c;
  }

  /** Sends a request (key, correlation ID, body) and resolves with its response code. */
  async request(key: number, body: Buffer): Promise<number> {
    const id = ++this.#correlation;
    const answered = new Promise<Buffer>((resolve) => this.#waiting.set(id, resolve));
    this.#write(frame(key, Buffer.concat([u32(id), body])));
    const response = await answered;
    return response.readUInt16BE(4);
  }

  /** Declares publisher `id` (a u8) on `stream`, named or not; resolves with the response code. */
  declarePublisher(id: number, stream: string, name = ''): Promise<number> {
    return this.request(0x0001, Buffer.concat([u8(id), str(name), str(stream)]));
  }

  /** Subscribes `id` (a u8) to `stream` from its first offset with no credit; the response code. */
  subscribe(id: number, stream: string): Promise<number> {
    return this.request(
      0x0007,
      Buffer.concat([u8(id), str(stream), Buffer.from([0, 1]), Buffer.from([0, 0]), u32(0)]),
    );
  }

  /**
   * Publishes one sub-entry batch (entry type 0x80 | codec << 4) with publishing ID `id`, declaring
   * `uncompressed` bytes and `count` records, its data as given; resolves with the confirm or the
   * publish error that answers it (the code), or rejects after `timeoutMs`.
   */
  publishSubEntry(
    publisherId: number,
    id: bigint,
    codec: number,
    count: number,
    uncompressed: number,
    data: Buffer,
    timeoutMs = 10_000,
  ): Promise<{ confirmed: boolean; code: number }> {
    const entry = Buffer.alloc(19);
    entry.writeBigUInt64BE(id, 0);
    entry[8] = 0x80 | (codec << 4);
    entry.writeUInt16BE(count, 9);
    entry.writeUInt32BE(uncompressed, 11);
    entry.writeUInt32BE(data.length, 15);
    const answer = this.#answerTo(publisherId, id, timeoutMs);
    this.#write(frame(0x0002, Buffer.concat([u8(publisherId), u32(1), entry, data])));
    return answer;
  }

  /** Publishes one plain entry; resolves with its confirm or publish error. */
  publishPlain(publisherId: number, id: bigint, message: Buffer, timeoutMs = 10_000) {
    const entry = Buffer.alloc(12);
    entry.writeBigUInt64BE(id, 0);
    entry.writeUInt32BE(message.length, 8);
    const answer = this.#answerTo(publisherId, id, timeoutMs);
    this.#write(frame(0x0002, Buffer.concat([u8(publisherId), u32(1), entry, message])));
    return answer;
  }

  close(): void {
    this.#socket.destroy();
  }

  #answerTo(
    publisherId: number,
    id: bigint,
    timeoutMs: number,
  ): Promise<{ confirmed: boolean; code: number }> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#listeners.delete(listener);
        reject(new Error(`no confirm or publish error for ID ${id} within ${timeoutMs} ms`));
      }, timeoutMs);
      const listener = (key: number, body: Buffer): void => {
        if ((key !== 0x0003 && key !== 0x0004) || body[0] !== publisherId) return;
        const n = body.readUInt32BE(1);
        for (let i = 0, o = 5; i < n; i++) {
          if (body.readBigUInt64BE(o) === id) {
            clearTimeout(timer);
            this.#listeners.delete(listener);
            resolve({ confirmed: key === 0x0003, code: key === 0x0003 ? 1 : body.readUInt16BE(o + 8) });
            return;
          }
          o += key === 0x0003 ? 8 : 10;
        }
      };
      this.#listeners.add(listener);
    });
  }

  #write(buf: Buffer): void {
    this.#socket.write(buf);
  }

  #read(chunk: Buffer): void {
    this.#buffer = Buffer.concat([this.#buffer, chunk]);
    while (this.#buffer.length >= 4) {
      const size = this.#buffer.readUInt32BE(0);
      if (this.#buffer.length < 4 + size) return;
      const f = this.#buffer.subarray(4, 4 + size);
      this.#buffer = this.#buffer.subarray(4 + size);
      const key = f.readUInt16BE(0);
      const body = f.subarray(4);
      if (key & 0x8000) {
        const id = body.readUInt32BE(0);
        const resolve = this.#waiting.get(id);
        this.#waiting.delete(id);
        resolve?.(body);
      } else if (key === 0x0016) {
        this.#closedBy = `close frame, code ${body.readUInt16BE(4)}`;
      } else {
        for (const l of [...this.#listeners]) l(key, body);
      }
    }
  }
}

function expectOk(code: number, what: string): void {
  if (code !== 1) throw new Error(`${what} answered response code ${code}`);
}

function frame(key: number, body: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(4 + body.length, 0);
  head.writeUInt16BE(key, 4);
  head.writeUInt16BE(1, 6);
  return Buffer.concat([head, body]);
}

function u8(n: number): Buffer {
  return Buffer.from([n]);
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}

function str(s: string): Buffer {
  const bytes = Buffer.from(s, 'utf8');
  const b = Buffer.alloc(2 + bytes.length);
  b.writeUInt16BE(bytes.length, 0);
  bytes.copy(b, 2);
  return b;
}
