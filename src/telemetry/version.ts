import { readFileSync } from 'node:fs';

let cached: string | undefined;

/**
 * The library's version from its own package.json (`../../package.json` from both dist/telemetry/
 * and src/telemetry/), read once: the instrumentation scope's version of its meter and tracer.
 * A package.json that cannot be read (a bundler that dropped it) gives `'unknown'`, never a throw:
 * telemetry must not stop a publisher from opening. @internal
 */
export function libraryVersion(): string {
  if (cached !== undefined) return cached;
  try {
    const { version } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
      version?: unknown;
    };
    cached = typeof version === 'string' ? version : 'unknown';
  } catch {
    cached = 'unknown';
  }
  return cached;
}
