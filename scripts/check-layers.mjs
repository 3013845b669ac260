// The layering check of `npm run hygiene` (`npm run layers`): dependency-cruiser with the rules of
// .dependency-cruiser.mjs (the layers of docs/design.md, "Layers"). Exits 1 on any violation and
// prints each as `error <rule>: <from> → <to>`.
//
// Through dependency-cruiser's API, not its command line: the command line (18.x) refuses to start
// on Node.js 20, the engines floor and the machine's node, while the API runs there (checked: the
// same result as the command line on Node.js 22, 116 modules and 484 imports).
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
