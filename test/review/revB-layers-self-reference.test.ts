/**
 * revB: the layering check (.dependency-cruiser.mjs, `npm run layers`) lets an upward import
 * through when it is spelled as the package's own name: `src/store/` importing
 * 'stream-dedup/stream' (package self-reference through "exports": tsc accepts it once dist/ is
 * built) reaches the entry layer, group and superstream, but resolves into dist/ or not at all,
 * which `includeOnly: ['^src/', …]` drops before any rule is checked. Run on a copy of the tree,
 * so the worktree is not touched.
 */
import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

function layersOn(plant: Record<string, string>): { code: number; output: string } {
  const dir = mkdtempSync(join(tmpdir(), 'revB-layers-'));
  try {
    for (const f of ['package.json', '.dependency-cruiser.mjs', 'tsconfig.build.json', 'tsconfig.json']) {
      cpSync(join(root, f), join(dir, f));
    }
    cpSync(join(root, 'src'), join(dir, 'src'), { recursive: true });
    cpSync(join(root, 'scripts'), join(dir, 'scripts'), { recursive: true });
    symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'));
    for (const [path, text] of Object.entries(plant)) writeFileSync(join(dir, path), text);
    try {
      const output = execFileSync(process.execPath, ['scripts/check-layers.mjs'], {
        cwd: dir,
        encoding: 'utf8',
      });
      return { code: 0, output };
    } catch (err) {
      const e = err as { status: number; stdout: string };
      return { code: e.status, output: e.stdout };
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('revB: layering check', () => {
  it('a relative upward import is caught (control)', () => {
    const r = layersOn({
      'src/store/planted.ts': "export { SuperStreamVerifyingConsumer } from '../group/consumer.js';\n",
    });
    expect(r.code).toBe(1);
    expect(r.output).toMatch(/layer-store: src\/store\/planted\.ts/);
  }, 60_000);

  it("the same upward import through the package's own name is caught too", () => {
    const r = layersOn({
      'src/store/planted.ts': "export { SuperStreamVerifyingConsumer } from 'stream-dedup/stream';\n",
    });
    // Observed: exit 0, no violation.
    expect(r.code).toBe(1);
  }, 60_000);
});
