/**
 * The server's errors as the store reports them: a `DedupError` `DEDUP_STORE_REFUSED` whose message
 * says what is wrong in words (a wrong password, a missing database, a missing schema, a read-only
 * role), with the server's error as its `cause`.
 */
import { DedupError } from '../errors.js';

/** SQLSTATE codes and what they mean here. */
const EXPLAINED: Readonly<Record<string, string>> = {
  '28P01': 'the password was refused',
  '28000': 'the role may not log in',
  '3D000': 'the database does not exist',
  '3F000': 'the schema does not exist: run migrate() or `stream-dedup migrate` first',
  '42P01': "the store's tables do not exist: run migrate() or `stream-dedup migrate` first",
  '42501': 'the role lacks a right the store needs (it writes offsets and verifier state)',
  '25006': 'the role or the server is read-only',
  '57P03': 'the server is starting up or shutting down',
};

/** `err`'s SQLSTATE code or Node.js error code, if it has one. */
export function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** `err` as a `DEDUP_STORE_REFUSED` prefixed by `what`. */
export function refusal(err: unknown, what: string): DedupError {
  const code = errorCode(err);
  const explained = code === undefined ? undefined : EXPLAINED[code];
  const detail = err instanceof Error ? err.message : String(err);
  return new DedupError(
    'DEDUP_STORE_REFUSED',
    explained === undefined ? `${what}: ${detail}` : `${what}: ${explained} (${detail})`,
    { cause: err },
  );
}
