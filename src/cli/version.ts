import { readFileSync } from 'node:fs';

/**
 * The version in the package's own package.json, read at run time: `../../package.json` from
 * both dist/cli/ (installed) and src/cli/ (run from source).
 */
export function packageVersion(): string {
  const url = new URL('../../package.json', import.meta.url);
  const { version } = JSON.parse(readFileSync(url, 'utf8')) as { version?: unknown };
  if (typeof version !== 'string') throw new Error(`no version in ${url.pathname}`);
  return version;
}
