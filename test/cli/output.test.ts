import { describe, expect, it } from 'vitest';
import { CliError, formatTable, plural, printable, progressReporter, toJson } from '../../src/cli/output.js';

describe('cli output', () => {
  it('toJson writes bigints as decimal strings and undefined as null', () => {
    expect(toJson({ id: 18446744073709551615n, none: undefined, list: [1n, undefined] })).toBe(
      '{"id":"18446744073709551615","none":null,"list":["1",null]}',
    );
  });

  it('formatTable pads columns two spaces apart, numbers right-aligned, without trailing spaces', () => {
    expect(
      formatTable(
        ['name', 'count', 'note'],
        [
          ['a', '1', ''],
          ['longer', '12345', 'x'],
        ],
        ['left', 'right', 'left'],
      ),
    ).toBe(['name    count  note', 'a           1', 'longer  12345  x'].join('\n'));
  });

  it('plural and printable', () => {
    expect([plural(1, 'gap'), plural(2, 'gap'), plural(1n, 'id'), plural(0n, 'id')]).toEqual([
      '1 gap',
      '2 gaps',
      '1 id',
      '0 ids',
    ]);
    expect([printable('orders-svc'), printable(''), printable('a\tb'), printable('ü-svc')]).toEqual([
      'orders-svc',
      '""',
      '"a\\tb"',
      'ü-svc',
    ]);
  });

  it('progress lines go to stderr only when it is a terminal', () => {
    const written = (isTTY: boolean): string => {
      const chunks: string[] = [];
      const sink = { isTTY, write: (s: string) => chunks.push(s) > 0 } as unknown as NodeJS.WriteStream;
      progressReporter(sink)('audit: reading');
      return chunks.join('');
    };
    expect(written(true)).toBe('audit: reading\n');
    expect(written(false)).toBe('');
  });
});

describe('cli errors', () => {
  it('CliError carries the exit code the CLI ends with', () => {
    const err = new CliError('no such producer', 4);
    expect(err).toBeInstanceOf(Error);
    expect(err).toMatchObject({ name: 'CliError', message: 'no such producer', exitCode: 4 });
  });
});
