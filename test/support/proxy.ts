import net from 'node:net';

/**
 * A loopback TCP proxy in front of the broker, for fault tests: cut every connection, refuse new
 * ones (the broker looks down), or stall traffic (the broker looks hung).
 */
export class FaultProxy {
  readonly #server: net.Server;
  readonly #pairs = new Set<[net.Socket, net.Socket]>();
  #refusing = false;
  #stalled = false;
  #paused = false;
  connections = 0;
  /** Connections closed at once while refusing. */
  refused = 0;

  private constructor(server: net.Server) {
    this.#server = server;
  }

  static async start(targetHost: string, targetPort: number): Promise<FaultProxy> {
    const holder: { proxy?: FaultProxy } = {};
    const server = net.createServer((client) => {
      if (holder.proxy !== undefined) holder.proxy.#accept(client, targetHost, targetPort);
    });
    const proxy = new FaultProxy(server);
    holder.proxy = proxy;
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  /** Connections open through the proxy now. */
  get openConnections(): number {
    return this.#pairs.size;
  }

  get port(): number {
    return (this.#server.address() as net.AddressInfo).port;
  }

  #accept(client: net.Socket, host: string, port: number): void {
    if (this.#refusing) {
      this.refused++;
      client.destroy();
      return;
    }
    this.connections++;
    const upstream = net.connect({ host, port });
    const pair: [net.Socket, net.Socket] = [client, upstream];
    this.#pairs.add(pair);
    const forward = (from: net.Socket, to: net.Socket): void => {
      from.on('data', (chunk: Buffer) => {
        if (!this.#stalled) to.write(chunk);
        // While stalled the bytes are dropped, as a hung peer would never answer them.
      });
    };
    forward(client, upstream);
    forward(upstream, client);
    if (this.#paused) client.pause();
    const close = (): void => {
      client.destroy();
      upstream.destroy();
      this.#pairs.delete(pair);
    };
    client.on('close', close).on('error', close);
    upstream.on('close', close).on('error', close);
  }

  /** Destroys every open connection (as a broker restart or a network cut would). */
  cut(): void {
    for (const [a, b] of this.#pairs) {
      a.destroy();
      b.destroy();
    }
    this.#pairs.clear();
  }

  /** While true, new connections are closed at once. */
  refuse(on: boolean): void {
    this.#refusing = on;
  }

  /**
   * While true, the proxy stops reading what clients send (a paused broker, a full window): their
   * sockets' buffers fill and writes wait for a `drain` that does not come.
   */
  pause(on: boolean): void {
    this.#paused = on;
    for (const [client] of this.#pairs) {
      if (on) client.pause();
      else client.resume();
    }
  }

  /** While true, bytes in both directions are dropped and the connections stay open. */
  stall(on: boolean): void {
    this.#stalled = on;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
