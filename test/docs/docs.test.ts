// The README and the guides (issue 38, items 2 and 3): the README stays a front door, its Quick
// start is what CI runs, every relative link and anchor resolves, and every TypeScript block
// type-checks against the source of the entry points (```ts fragment blocks excepted). The short
// blocks marked ```ts run are also run against the broker: test/integration/docs-snippets.test.ts.
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { docFiles, entryPaths, ROOT, snippets } from '../support/doc-snippets.js';

const read = (file: string): string => readFileSync(join(ROOT, file), 'utf8');

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-');
}

function anchors(file: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  let code = false;
  for (const line of read(file).split('\n')) {
    if (line.startsWith('```')) code = !code;
    const h = code ? null : /^#{1,6} (.*)$/.exec(line);
    if (h === null) continue;
    const base = slug(h[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

describe('docs - the README and the guides', () => {
  it('the README is at most 300 lines', () => {
    expect(read('README.md').split('\n').length).toBeLessThanOrEqual(300);
  });

  it("the Quick start's test line is the command CI runs, and its demo line runs the demo", () => {
    const ci = read('.ci/run')
      .split('\n')
      .find((l) => l.startsWith('bash scripts/rabbitmq.sh up'));
    const quickStart = /## Quick start[\s\S]*?```sh\n([\s\S]*?)```/.exec(read('README.md'))?.[1]?.split('\n');
    expect(ci).toBeDefined();
    expect(quickStart).toEqual(['bash scripts/rabbitmq.sh up && npm ci && npm run demo', ci, '']);
  });

  it('every relative link of the README and the guides reaches a file, and every anchor a heading', () => {
    const broken: string[] = [];
    for (const file of docFiles()) {
      const text = read(file).replace(/```[\s\S]*?```/g, '');
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/.test(target!)) continue; // http(s), mailto
        const [path, anchor] = target!.split('#') as [string, string | undefined];
        const resolved = path === '' ? file : join(dirname(file), path);
        // docs/api/ is generated (npm run docs:api), not committed.
        if (resolved.startsWith('docs/api/')) continue;
        if (!existsSync(join(ROOT, resolved))) broken.push(`${file}: ${target} (no such file)`);
        else if (anchor !== undefined && resolved.endsWith('.md') && !anchors(resolved).has(anchor))
          broken.push(`${file}: ${target} (no such heading)`);
      }
    }
    expect(broken).toEqual([]);
  });

  it('every TypeScript block of the README and the guides type-checks against the entry points', () => {
    const dir = join(ROOT, '.tmp', 'doc-snippets');
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    const files: string[] = [];
    const where = new Map<string, string>();
    for (const doc of docFiles()) {
      for (const s of snippets(doc)) {
        if (s.flags.includes('fragment')) continue;
        const file = join(dir, `${s.name.replace(/[^a-z0-9]+/gi, '-')}.ts`);
        // `export {}`: each block is a module of its own (top-level await, its own names).
        writeFileSync(file, `${s.code}export {};\n`);
        files.push(file);
        where.set(file, `${s.file}:${s.line}`);
      }
    }
    expect(files.length, 'blocks found').toBeGreaterThanOrEqual(6);
    const config = ts.getParsedCommandLineOfConfigFile(
      join(ROOT, 'tsconfig.json'),
      {},
      {
        ...ts.sys,
        onUnRecoverableConfigFileDiagnostic: (d) => {
          throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
        },
      },
    )!;
    const program = ts.createProgram(files, {
      ...config.options,
      noEmit: true,
      noUnusedLocals: false,
      baseUrl: ROOT,
      paths: entryPaths(),
    });
    const diagnostics = ts.getPreEmitDiagnostics(program);
    // Left behind, the blocks would be linted by `eslint .` as the repository's own files.
    rmSync(dir, { recursive: true, force: true });
    const errors = diagnostics
      .filter((d) => d.file !== undefined && files.includes(d.file.fileName))
      .map((d) => {
        const { line } = d.file!.getLineAndCharacterOfPosition(d.start ?? 0);
        return `${where.get(d.file!.fileName)} (+${line + 1}): ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
      });
    expect(errors).toEqual([]);
    // A program over the entry points' whole source: 20-30 s on a loaded 2-core machine.
  }, 120_000);
});
