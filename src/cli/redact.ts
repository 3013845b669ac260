/**
 * A connection URL as the CLI may print it: the password (in the user part, or as a `password`
 * query parameter, both of which `pg` honours) replaced by `***`. Parsed as a URL, not matched by
 * a pattern: a password holding `:` or `@` is split where the URL parser splits it (review A: the
 * pattern it replaces printed the head of such a password, and every `?password=`).
 */
export function redactUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return '(a URL that does not parse)';
  }
  if (parsed.password !== '') parsed.password = '***';
  for (const key of [...parsed.searchParams.keys()]) {
    if (/pass|secret|key/i.test(key)) parsed.searchParams.set(key, '***');
  }
  return parsed.toString();
}
