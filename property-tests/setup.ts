import fc from 'fast-check';

// Every run is reproducible: the seed comes from FC_SEED or is drawn here, and is always printed.
// Replay a failure with `FC_SEED=<seed> npm run test:property` (add FC_PATH=<path> to jump to the
// shrunk counterexample fast-check printed).
const seed =
  process.env.FC_SEED === undefined ? Date.now() ^ (Math.random() * 0x7fffffff) : Number(process.env.FC_SEED);
const path = process.env.FC_PATH;
const numRuns = process.env.FC_NUM_RUNS === undefined ? undefined : Number(process.env.FC_NUM_RUNS);
fc.configureGlobal({
  seed,
  ...(path === undefined ? {} : { path }),
  ...(numRuns === undefined ? {} : { numRuns }),
});
console.log(
  `[fast-check] seed=${seed}${path === undefined ? '' : ` path=${path}`} (replay: FC_SEED=${seed} npm run test:property)`,
);
