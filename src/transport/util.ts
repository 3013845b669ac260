/** Rejects with `${what} timed out after ${ms} ms` unless `promise` settles first. */
export function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** A one-line description of a client error (AggregateErrors from dual-stack connects included). */
export function errorText(err: unknown): string {
  if (err instanceof AggregateError && err.errors.length > 0) return err.errors.map(errorText).join('; ');
  if (err instanceof Error) return err.message || err.name;
  return String(err);
}
