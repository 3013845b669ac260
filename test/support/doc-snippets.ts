/**
 * The code blocks of README.md and docs/guides/*.md, for the tests that type-check and run them
 * (test/docs/docs.test.ts, test/integration/docs-snippets.test.ts). A block fenced ```ts is
 * type-checked; ```ts fragment is not (it shows a piece of a program, with `…`); ```ts run is
 * type-checked and also run against the real broker.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** README.md and every guide, as paths relative to the repository root. */
export function docFiles(): string[] {
  const guides = join(ROOT, 'docs/guides');
  return [
    'README.md',
    ...readdirSync(guides)
      .filter((f) => f.endsWith('.md'))
      .map((f) => relative(ROOT, join(guides, f))),
  ];
}

/** One fenced block of a document. */
export interface Snippet {
  /** `README.md#3`: the file and the block's number among its TypeScript blocks (from 1). */
  readonly name: string;
  readonly file: string;
  /** The line of the opening fence (from 1). */
  readonly line: number;
  readonly flags: readonly string[];
  readonly code: string;
}

/** The TypeScript blocks (```ts) of one document. */
export function snippets(file: string): Snippet[] {
  const lines = readFileSync(join(ROOT, file), 'utf8').split('\n');
  const out: Snippet[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(ts|typescript)\b(.*)$/.exec(lines[i]!);
    if (open === null) continue;
    const start = i;
    const body: string[] = [];
    for (i++; i < lines.length && !lines[i]!.startsWith('```'); i++) body.push(lines[i]!);
    out.push({
      name: `${file}#${out.length + 1}`,
      file,
      line: start + 1,
      flags: open[2]!.trim().split(/\s+/).filter(Boolean),
      code: `${body.join('\n')}\n`,
    });
  }
  return out;
}

/**
 * The package's entry points, `stream-dedup/stream` → `src/stream.ts`, from
 * package.json's `exports` (their `types` under dist/ map back to src/), so that snippets are
 * checked against the source without a build.
 */
export function entryPaths(): Record<string, string[]> {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    name: string;
    exports: Record<string, string | { types?: string }>;
  };
  const paths: Record<string, string[]> = {};
  for (const [key, target] of Object.entries(pkg.exports)) {
    if (typeof target !== 'object' || target.types === undefined) continue;
    const src = target.types.replace(/^\.\/dist\//, './src/').replace(/\.d\.ts$/, '.ts');
    paths[key === '.' ? pkg.name : `${pkg.name}/${key.slice(2)}`] = [src];
  }
  return paths;
}
