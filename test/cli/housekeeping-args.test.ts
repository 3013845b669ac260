import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { unknownCommandHint } from '../../src/cli/command-hint.js';
import { MAX_PARTITIONS, planSuperStream } from '../../src/cli/create-super-stream.js';
import { describeDeletion } from '../../src/cli/delete.js';
import { checkListArgs } from '../../src/cli/list.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';

const [cmd, ...pre] = CLI_FROM_SOURCE;

/** Runs the CLI from source against a port nothing listens on: these cases must fail before any I/O. */
async function cli(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(cmd!, [...pre, ...args], {
      timeout: 30_000,
      env: { ...process.env, RABBITMQ_HOST: '127.0.0.1', RABBITMQ_STREAM_PORT: '1' },
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('cli - create-super-stream arguments', () => {
  it('--partitions N names the partitions <name>-0 … with keys 0 …; --keys binds the given keys', () => {
    expect(planSuperStream('orders', '3', undefined)).toEqual({
      name: 'orders',
      partitions: ['orders-0', 'orders-1', 'orders-2'],
      bindingKeys: ['0', '1', '2'],
      keyed: false,
    });
    expect(planSuperStream('orders', undefined, 'eu,us')).toEqual({
      name: 'orders',
      partitions: ['orders-eu', 'orders-us'],
      bindingKeys: ['eu', 'us'],
      keyed: true,
    });
    expect(planSuperStream('o', String(MAX_PARTITIONS), undefined)).toMatchObject({ keyed: false });
  });

  it('refuses partitions outside 1..1000, both or neither option, empty, repeated or too many keys, and names over 255 bytes', () => {
    for (const n of ['0', '1001', '-1', '1.5', '01', 'ten', '', '1e3']) {
      expect(planSuperStream('o', n, undefined), n).toMatch(
        /^--partitions expects an integer from 1 to 1000/,
      );
    }
    expect(planSuperStream('o', '2', 'a')).toBe('give exactly one of --partitions N and --keys k1,k2,…');
    expect(planSuperStream('o', undefined, undefined)).toBe(
      'give exactly one of --partitions N and --keys k1,k2,…',
    );
    expect(planSuperStream('o', undefined, 'a,,b')).toMatch(/^--keys expects non-empty keys/);
    expect(planSuperStream('o', undefined, 'a, b')).toMatch(/^--keys expects non-empty keys/);
    expect(planSuperStream('o', undefined, 'a,b,a')).toMatch(/^--keys must be distinct/);
    const keys = Array.from({ length: 1001 }, (_, i) => `k${i}`).join(',');
    expect(planSuperStream('o', undefined, keys)).toMatch(/^--keys gives 1001 keys: at most 1000/);
    expect(planSuperStream('é'.repeat(127), '10', undefined)).toMatch(/longer than 255 UTF-8 bytes/);
    expect(planSuperStream('', '1', undefined)).toBe('the super stream name must not be empty');
  });
});

describe('cli - list and delete arguments', () => {
  it('list needs a name (the protocols cannot enumerate streams) and refuses a group name with a dot', () => {
    expect(checkListArgs({ names: [], groups: [], producers: [] })).toMatch(/cannot enumerate/);
    expect(checkListArgs({ names: ['s'], groups: ['a.b'], producers: [] })).toMatch(/holds no '\.'/);
    expect(checkListArgs({ names: ['s'], groups: ['g'], producers: ['p'] })).toEqual({
      names: ['s'],
      groups: ['g'],
      producers: ['p'],
    });
  });

  it('the deletion is described with its partitions and changelogs', () => {
    expect(
      describeDeletion({
        name: 'o',
        kind: 'super-stream',
        partitions: ['o-0', 'o-1'],
        changelogs: ['o-0.g.changelog'],
      }),
    ).toBe('super stream "o" with 2 partitions (o-0, o-1) and 1 changelog (o-0.g.changelog)');
    expect(describeDeletion({ name: 's', kind: 'stream', partitions: [], changelogs: [] })).toBe(
      'stream "s"',
    );
  });
});

describe('cli - a mistyped command', () => {
  it('gets a one-line hint with the nearest command, not the whole help', () => {
    expect(unknownCommandHint('audti')).toBe(
      'unknown command "audti" (did you mean audit?): stream-dedup help lists the commands',
    );
    expect(unknownCommandHint('create')).toContain('(did you mean create-super-stream?)');
    expect(unknownCommandHint('frobnicate')).toBe(
      'unknown command "frobnicate": stream-dedup help lists the commands',
    );
  });

  it(
    'usage errors exit 2 before any I/O: a mistyped command, delete without --yes off a terminal, 1001 partitions',
    { timeout: 90_000 },
    async () => {
      const [typo, del, create, list] = await Promise.all([
        cli('lsit'),
        cli('delete', 'orders'),
        cli('create-super-stream', 'orders', '--partitions', '1001'),
        cli('list'),
      ]);
      expect(typo).toMatchObject({
        code: 2,
        stderr: 'unknown command "lsit" (did you mean list?): stream-dedup help lists the commands\n',
      });
      expect(del).toMatchObject({
        code: 2,
        stderr: 'delete: refusing to delete without --yes: there is no terminal to ask on\n',
      });
      expect(create.code).toBe(2);
      expect(create.stderr).toMatch(/^create-super-stream: --partitions expects an integer from 1 to 1000/);
      expect(list.code).toBe(2);
      expect(list.stderr).toMatch(/^list: expects one or more stream or super stream names/);
    },
  );
});
