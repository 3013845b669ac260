// TypeDoc configuration for `npm run docs:api` (the API reference, issue 38 item 3).
// Entry points are read from package.json's `exports`, so an entry file that moves (or a new entry)
// needs no change here: each export's `types` path under dist/ maps back to its source under src/.
import { readFileSync } from 'node:fs';
import { URL } from 'node:url';

const pkg = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8'));
const entryPoints = Object.entries(pkg.exports)
  .filter(([, target]) => typeof target === 'object' && typeof target.types === 'string')
  .map(([, target]) => target.types.replace(/^\.\/dist\//, './src/').replace(/\.d\.ts$/, '.ts'));

/** @type {Partial<import('typedoc').TypeDocOptions>} */
const config = {
  entryPoints,
  plugin: ['./scripts/typedoc-defaults.mjs'],
  tsconfig: './tsconfig.build.json',
  out: './docs/api',
  name: 'stream-dedup',
  readme: 'none',
  excludeInternal: true,
  excludePrivate: true,
  excludeProtected: true,
  // Every exported name, and every member reachable from one, has TSDoc; no link is broken.
  validation: { notExported: true, invalidLink: true, notDocumented: true, unusedMergeModuleWith: true },
  // The PostgreSQL store implements the consumers' internal store interface; users never name it.
  intentionallyNotExported: ['ConsumerStoreProvider'],
  treatWarningsAsErrors: true,
  treatValidationWarningsAsErrors: true,
  githubPages: false,
  // Source links name the repository of package.json, at the commit built (a clean clone has no
  // `origin` remote TypeDoc could read them from).
  sourceLinkTemplate: `${pkg.repository.url.replace(/^git\+/, '').replace(/\.git$/, '')}/blob/{gitRevision}/{path}#L{line}`,
};

export default config;
