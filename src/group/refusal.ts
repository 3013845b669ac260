/**
 * Tells a permanent refusal by the broker from a failure that may pass (docs/design.md §12): a
 * member that cannot write or read its changelog for good must stop with `DEDUP_BROKER_REFUSED`,
 * not drop its batch, take the partition over again and re-run the handler, forever, with
 * warnings only.
 */
import { StreamDoesNotExistError } from '../transport/util.js';

/**
 * Stream protocol response codes that no retry changes: 8 authentication failure, 12 virtual host
 * access failure, 16 access refused (the user's permissions do not cover the stream).
 */
const PERMANENT_CODES: ReadonlyMap<number, string> = new Map([
  [8, 'authentication failure'],
  [12, 'virtual host access failure'],
  [16, 'access refused'],
]);

/** The client's words for a refused command: "… command returned error with code 16 - …". */
const RESPONSE_CODE = /returned error with code (\d+)\b/;

/**
 * Why `err` is a permanent refusal (its broker response code, or a stream that does not exist
 * although the writer's connect creates it), or `undefined` when it may pass (a timeout, a lost
 * node, a leader election). Looks through the whole cause chain and aggregated errors.
 *
 * @internal
 */
export function permanentRefusal(err: unknown): string | undefined {
  const seen = new Set<unknown>();
  const visit = (e: unknown): string | undefined => {
    if (!(e instanceof Error) || seen.has(e)) return undefined;
    seen.add(e);
    // Believed only once heard twice, through two nodes or 2 s apart (MissingStreamCheck).
    if (e instanceof StreamDoesNotExistError) {
      return 'the stream does not exist (broker response code 2), and creating it did not succeed';
    }
    const match = RESPONSE_CODE.exec(e.message);
    const code = match === null ? undefined : Number(match[1]);
    const name = code === undefined ? undefined : PERMANENT_CODES.get(code);
    if (name !== undefined) return `${name} (broker response code ${code})`;
    if (e instanceof AggregateError) {
      for (const inner of e.errors as unknown[]) {
        const found = visit(inner);
        if (found !== undefined) return found;
      }
    }
    return visit(e.cause);
  };
  return visit(err);
}
