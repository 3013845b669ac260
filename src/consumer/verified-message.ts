/**
 * The message object a handler receives: one per delivery, with its headers merged only when
 * someone reads them.
 */
import type { MessageIdentity } from '../identity/headers.js';
import type { IncomingMessage, VerifiedMessage } from './types.js';

/**
 * The handler's message; `headers` merges the sources only when someone reads it.
 *
 * @internal
 */
export class Verified implements VerifiedMessage {
  readonly body: Buffer;
  readonly offset: bigint;
  identity: MessageIdentity | undefined = undefined;
  tenant = '';
  readonly #message: IncomingMessage;
  #headers: Readonly<Record<string, unknown>> | undefined;

  constructor(message: IncomingMessage) {
    this.body = message.content;
    this.offset = message.offset;
    this.#message = message;
  }

  get headers(): Readonly<Record<string, unknown>> {
    this.#headers ??= mergeHeaders(this.#message);
    return this.#headers;
  }
}

function mergeHeaders(message: IncomingMessage): Readonly<Record<string, unknown>> {
  const { applicationProperties: first, messageAnnotations: second } = message;
  if (second === undefined) return first ?? {};
  if (first === undefined) return second;
  // Both: the application properties win over annotations of the same name. Configurable, so that
  // the second definition of a name replaces the first (a non-configurable one threw a TypeError:
  // any message with one header in both sections stopped a consumer whose tenant read it).
  const out: Record<string, unknown> = {};
  for (const s of [second, first])
    for (const [k, v] of Object.entries(s)) {
      Object.defineProperty(out, k, { value: v, enumerable: true, configurable: true });
    }
  return out;
}
