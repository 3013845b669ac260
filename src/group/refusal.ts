/**
 * Tells a permanent refusal by the broker from a failure that may pass (docs/design.md §12): a
 * member that cannot write or read its changelog for good must stop with `DEDUP_BROKER_REFUSED`,
 * not drop its batch, take the partition over again and re-run the handler, forever, with
 * warnings only.
 */

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
 * Why `err` is a permanent refusal (its broker response code, its own or that of the create a
 * "does not exist" came after), or `undefined` when it may pass (a timeout, a lost node, a leader
 * election, a stream not there yet). Looks through the whole cause chain and aggregated errors.
 *
 * @internal
 */
export function permanentRefusal(err: unknown): string | undefined {
  const seen = new Set<unknown>();
  const visit = (e: unknown): string | undefined => {
    if (!(e instanceof Error) || seen.has(e)) return undefined;
    seen.add(e);
    // "Does not exist" alone may pass: the writer's create can fail for a moment (a coordinator
    // election in a rolling restart) and the next connect creates it. It is permanent only when the
    // create itself was refused for good: the transport puts the create's error in its cause chain
    // (an AggregateError), where the response code below finds it.
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
