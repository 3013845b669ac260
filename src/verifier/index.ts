// The verifier's public surface: pure sequence policies (docs/design.md §5), no I/O.
export type { CheckResult, IdRange, Outcome, PolicySpec, RecordResult, SequenceTracker } from './types.js';
export { MAX_DECLARED_RANGES, MAX_WINDOW_SIZE } from './types.js';
export { createTracker, decodeTracker } from './window.js';
export { ScopedVerifier, type ScopeEntry } from './scoped.js';
