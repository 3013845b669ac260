// A vitest reporter that ends the run with one plain line, 'tests: N passed, N failed, N skipped',
// which CI reads whatever the test runner. With STREAM_DEDUP_SUMMARY_FILE set it also appends
// 'N N N' to that file, for scripts/test-all.sh to add up several runs (one per broker line or
// Node.js version). With STREAM_DEDUP_FAILURES_FILE set it appends one line per failed test (its
// file, its full name and the first line of its error, the first three with the rest of the message
// indented beneath) and per unhandled error, which test-all.sh
// prints again as the very last lines of the whole run: CI shows only the end of a long output, and a
// failure must be readable there.
import { appendFileSync } from 'node:fs';
import { relative } from 'node:path';

const label = process.env.STREAM_DEDUP_RUN_LABEL ?? `Node.js ${process.version}`;

function firstLine(error) {
  const text = String(error?.message ?? error ?? 'unknown error');
  const line = text.split('\n').find((l) => l.trim() !== '') ?? text;
  return line.length > 300 ? `${line.slice(0, 300)}…` : line;
}

/** Failures whose whole message (up to DETAIL_LINES lines) is kept; the rest get their first line. */
const DETAILED_FAILURES = 3;
const DETAIL_LINES = 40;

/**
 * The first line of the error, then, for the first few failures of a run, the rest of its message
 * indented (at most DETAIL_LINES lines of 300 characters): a wait that timed out says what it saw
 * after its first line ("last lines: …", the broker's view), and CI shows only the end of the run.
 */
function describe(error, detailed) {
  const head = firstLine(error);
  if (!detailed) return head;
  const text = String(error?.message ?? error ?? '');
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trim() !== '');
  const rest = lines.slice(start + 1).filter((l) => l.trim() !== '');
  if (rest.length === 0) return head;
  const kept = rest.slice(0, DETAIL_LINES).map((l) => `    | ${l.length > 300 ? `${l.slice(0, 300)}…` : l}`);
  if (rest.length > DETAIL_LINES)
    kept.push(`    | … ${rest.length - DETAIL_LINES} more lines in the run's output`);
  return [head, ...kept].join('\n');
}

export default class SummaryReporter {
  onTestRunEnd(testModules, unhandledErrors) {
    let passed = 0;
    let failed = 0;
    let skipped = 0;
    const failures = [];
    for (const module of testModules) {
      const file = relative(process.cwd(), module.moduleId);
      for (const test of module.children.allTests()) {
        const result = test.result();
        if (result.state === 'passed') passed++;
        else if (result.state === 'failed') {
          failed++;
          failures.push(
            `${file} > ${test.fullName}: ${describe(result.errors?.[0], failures.length < DETAILED_FAILURES)}`,
          );
        } else skipped++;
      }
      if (module.state() === 'failed' && module.children.size === 0) {
        failed++;
        failures.push(`${file}: ${firstLine(module.errors?.()[0])}`);
      }
    }
    failed += unhandledErrors.length;
    for (const error of unhandledErrors) failures.push(`unhandled error: ${firstLine(error)}`);
    process.stdout.write(`\ntests: ${passed} passed, ${failed} failed, ${skipped} skipped\n`);
    const file = process.env.STREAM_DEDUP_SUMMARY_FILE;
    if (file) appendFileSync(file, `${passed} ${failed} ${skipped}\n`);
    const failuresFile = process.env.STREAM_DEDUP_FAILURES_FILE;
    if (failuresFile && failures.length > 0) {
      appendFileSync(failuresFile, failures.map((f) => `[${label}] ${f}\n`).join(''));
    }
  }
}
