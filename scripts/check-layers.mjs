// The layering check of `npm run hygiene` (`npm run layers`): dependency-cruiser with the rules of
// .dependency-cruiser.mjs (the layers of docs/design.md, "Layers"). Exits 1 on any violation and
// prints each as `error <rule>: <from> → <to>`.
//
// Through dependency-cruiser's API, not its command line (written against 18.x, whose command line
// refuses Node.js 20). The package is held at 17.4 (engines ^20.12 || ^22 || >=24): 18 declares
// Node.js ≥ 22, and `npm ci --engine-strict` under Node.js 20 (scripts/node-versions.sh, the engines
// floor) refuses the whole lock file for it.
import { cruise } from 'dependency-cruiser';
import extractTSConfig from 'dependency-cruiser/config-utl/extract-ts-config';
import { URL, fileURLToPath } from 'node:url';
import config from '../.dependency-cruiser.mjs';

process.chdir(fileURLToPath(new URL('..', import.meta.url)));
const result = await cruise(
  ['src'],
  { ...config.options, validate: true, ruleSet: { forbidden: config.forbidden }, outputType: 'err' },
  undefined,
  { tsConfig: extractTSConfig(config.options.tsConfig.fileName) },
);
process.stdout.write(result.output);
process.exitCode = result.exitCode === 0 ? 0 : 1;
