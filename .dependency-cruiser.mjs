// The layers of src/ (docs/design.md, "Layers"), checked by `npm run layers` (part of
// `npm run hygiene`): a module imports only from its own folder and from layers below its own.
// Layers of the same rank are siblings and never import each other. Type-only imports count
// (tsPreCompilationDeps): a type import upwards couples the layers as much as a value import.

/** Bottom to top: [rank, name, path pattern]. */
const LAYERS = [
  [0, 'errors', '^src/errors\\.ts$'],
  [1, 'util', '^src/util/'],
  [1, 'identity', '^src/identity/'],
  [1, 'telemetry', '^src/telemetry/'],
  [1, 'history', '^src/history/'],
  [2, 'verifier', '^src/verifier/'],
  [3, 'store', '^src/store/'],
  [4, 'publisher', '^src/publisher/'],
  [4, 'consumer', '^src/consumer/'],
  [5, 'transport', '^src/transport/'],
  [5, 'postgres', '^src/postgres/(?!outbox/)'],
  [6, 'superstream', '^src/superstream/'],
  [7, 'group', '^src/group/'],
  // The outbox relay publishes through the stream transport and routes by the super stream's hash.
  [7, 'outbox', '^src/postgres/outbox/'],
  [8, 'entry', '^src/(index|stream|amqp|postgres|testing)\\.ts$'],
  [9, 'cli', '^src/cli/'],
];

const upward = LAYERS.flatMap(([rank, name, path]) => {
  const above = LAYERS.filter(([r, n]) => r >= rank && n !== name).map(([, , p]) => p);
  // The top layer has nothing above it (an empty list would match every module).
  if (above.length === 0) return [];
  return [
    {
      name: `layer-${name}`,
      severity: 'error',
      comment: `${name} (rank ${rank}) imports only layers below it (docs/design.md, "Layers")`,
      from: { path },
      to: { path: above },
    },
  ];
});

/** @type {import('dependency-cruiser').IConfiguration} */
export default {
  forbidden: [
    ...upward,
    {
      name: 'no-entry-inside',
      severity: 'error',
      comment: 'an entry file only re-exports; the code of src/ imports the module itself',
      from: { path: '^src/' },
      to: { path: '^src/(index|stream|amqp|postgres|testing)\\.ts$' },
    },
    {
      name: 'pg-only-in-postgres',
      severity: 'error',
      comment: 'pg is an optional peer dependency: only src/postgres/ loads it',
      from: { path: '^src/', pathNot: '^src/postgres/' },
      to: { path: '(^|/)node_modules/(@types/)?pg/' },
    },
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'no import cycle (npm run cycles says the same with dpdm)',
      from: {},
      to: { circular: true },
    },
    {
      name: 'not-outside-src',
      severity: 'error',
      comment: 'the package imports nothing from tests, benches or scripts',
      from: { path: '^src/' },
      to: { path: '^(test|property-tests|bench|scripts|examples)/' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    includeOnly: ['^src/', 'node_modules/(@types/)?pg/'],
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.build.json' },
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
