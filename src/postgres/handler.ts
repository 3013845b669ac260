/**
 * `postgresHandler`: types a handler that runs its SQL in the batch's transaction.
 */
import type { MessageHandler, VerifiedMessage } from '../consumer/types.js';
import type { PostgresTransaction } from './handler-client.js';

/**
 * A handler on a `PostgresStore`: its SQL runs through `tx.client` in the batch's transaction.
 *
 * @remarks Since 0.6.0
 */
export type PostgresMessageHandler = (
  message: VerifiedMessage,
  tx: PostgresTransaction,
) => void | Promise<void>;

/**
 * Makes `handler` the `handler` option of a verifying consumer whose `store` is a `PostgresStore`
 * (the option's own type names the LevelDB transaction).
 *
 * @example
 * ```ts
 * handler: postgresHandler(async (message, { client }) => {
 *   await client.query('UPDATE balances SET amount = amount + $1 WHERE id = 1', [Number(message.body)]);
 * }),
 * ```
 * @remarks Since 0.6.0
 */
export function postgresHandler(handler: PostgresMessageHandler): MessageHandler {
  if (typeof handler !== 'function')
    throw new TypeError(`Expected handler to be a function, got ${typeof handler}`);
  return handler as unknown as MessageHandler;
}
