// Removes build outputs in dist/ whose source in src/ is gone (a moved or deleted module), so that
// a stale file is never published. Outputs of existing sources are left for tsc to overwrite: a
// build running at the same time elsewhere in this checkout never sees dist/ emptied.
import { existsSync, readdirSync, rmSync } from 'node:fs';
import { join, relative } from 'node:path';
import { URL, fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const dist = join(root, 'dist');
const OUTPUT = /\.(?:d\.ts\.map|d\.ts|js\.map|js)$/;

function walk(dir) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      walk(path);
      if (readdirSync(path).length === 0) rmSync(path, { recursive: true });
    } else if (OUTPUT.test(entry.name)) {
      const source = join(root, 'src', relative(dist, path).replace(OUTPUT, '.ts'));
      if (!existsSync(source)) {
        rmSync(path);
        console.log(`clean-dist: removed ${relative(root, path)} (no ${relative(root, source)})`);
      }
    }
  }
}

if (existsSync(dist)) walk(dist);
