import type { Client } from 'rabbitmq-stream-js-client';
import { afterAll } from 'vitest';
import { uniqueName } from './broker.js';

/**
 * Super streams for one test file: the returned function creates one (`<name>-0` … with
 * `partitions` partitions, or `<name>-<key>` for `bindingKeys`) and every one is deleted after the
 * file's tests. `client` is read when used (a `useClient()` getter, or a client set in beforeAll).
 */
export function useSuperStreams(
  client: () => Client,
): (prefix: string, partitions?: number, bindingKeys?: string[]) => Promise<string> {
  const created: string[] = [];
  afterAll(async () => {
    for (const name of created)
      await client()
        .deleteSuperStream({ streamName: name })
        .catch(() => undefined);
  });
  return async (prefix, partitions = 3, bindingKeys) => {
    const name = uniqueName(prefix);
    await client().createSuperStream({ streamName: name, arguments: {} }, bindingKeys, partitions);
    created.push(name);
    return name;
  };
}

/**
 * The partition the JavaScript client's own super stream publisher routes `key` to (hash
 * strategy): the reference the library's routing is checked against.
 */
export async function jsClientRouter(c: Client, name: string): Promise<(key: string) => Promise<string>> {
  const publisher = await c.declareSuperStreamPublisher(
    { superStream: name, routingStrategy: 'hash' },
    (content) => content,
  );
  // routeMessage is private in its types; it is what its send() calls (no publisher is declared by it).
  const routing = publisher as unknown as { routeMessage(content: Buffer, opts: object): Promise<string> };
  return (key) => routing.routeMessage(Buffer.from(key), {});
}
