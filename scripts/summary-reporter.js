// A vitest reporter that ends the run with one plain line, 'tests: N passed, N failed, N skipped',
// which CI reads whatever the test runner. With STREAM_DEDUP_SUMMARY_FILE set it also appends
// 'N N N' to that file, for scripts/test-all.sh to add up several runs (one per broker line).
import { appendFileSync } from 'node:fs';

export default class SummaryReporter {
  onTestRunEnd(testModules, unhandledErrors) {
    let passed = 0;
    let failed = 0;
    let skipped = 0;
    for (const module of testModules) {
      for (const test of module.children.allTests()) {
        const state = test.result().state;
        if (state === 'passed') passed++;
        else if (state === 'failed') failed++;
        else skipped++;
      }
      if (module.state() === 'failed' && module.children.size === 0) failed++;
    }
    failed += unhandledErrors.length;
    process.stdout.write(`\ntests: ${passed} passed, ${failed} failed, ${skipped} skipped\n`);
    const file = process.env.STREAM_DEDUP_SUMMARY_FILE;
    if (file) appendFileSync(file, `${passed} ${failed} ${skipped}\n`);
  }
}
