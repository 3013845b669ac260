import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { packageVersion } from '../../src/cli/version.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';

const run = promisify(execFile);
const [cmd, ...pre] = CLI_FROM_SOURCE;

/** Runs the CLI from source (no broker: these commands never connect). */
async function cli(...args: string[]): Promise<{ stdout: string; stderr: string }> {
  return run(cmd!, [...pre, ...args], { timeout: 30_000 });
}

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
  version: string;
};

/** Every RABBITMQ_* and STREAM_DEDUP_* name that appears in the CLI's sources. */
function variablesTheCliReads(): string[] {
  const dir = new URL('../../src/cli/', import.meta.url);
  const names = new Set<string>();
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts'))) {
    const text = readFileSync(new URL(file, dir), 'utf8');
    for (const [name] of text.matchAll(/\b(?:RABBITMQ|STREAM_DEDUP)_[A-Z0-9_]+\b/g)) names.add(name);
  }
  return [...names].sort();
}

describe('cli --version and help', () => {
  it('packageVersion() is the version in package.json', () => {
    expect(packageVersion()).toBe(pkg.version);
  });

  it('--version prints the version alone and exits 0', { timeout: 60_000 }, async () => {
    const { stdout, stderr } = await cli('--version');
    expect(stdout).toBe(`${pkg.version}\n`);
    expect(stderr).toBe('');
  });

  it('help names every environment variable the CLI reads', { timeout: 60_000 }, async () => {
    const { stdout } = await cli('--help');
    expect(stdout).toContain('Usage:');
    expect(stdout).toContain('--version');
    const names = variablesTheCliReads();
    expect(names).toContain('RABBITMQ_STREAM_ENDPOINTS');
    expect(names).toContain('RABBITMQ_HOST');
    for (const name of names) expect(stdout, `${name} in the help`).toMatch(new RegExp(`\\b${name}\\b`));
  });
});
