import { describe, expect, it } from 'vitest';
import { formatReport } from '../../src/testing.js';
import { runCrashScenario } from '../../src/cli/crash.js';
import { uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';

// docs/design.md §10 and §7: with sub-entry batches, every message whose send() resolved is in the
// stream exactly once, in ID order, across SIGKILLs at random moments — the outbox re-sends the
// batches it recorded, so the broker keeps or drops each whole.
describe('sub-entry batches - crash and restart', () => {
  for (const [durability, compression] of [
    ['outbox', 'none'],
    ['reserve', 'gzip'],
  ] as const) {
    it(`${durability}, ${compression}: 20 SIGKILLs lose no acknowledged message and duplicate none`, async () => {
      const result = await runCrashScenario({
        cli: CLI_FROM_SOURCE,
        stream: uniqueName(`sub-crash-${durability}`),
        producerName: `sub-crash-${durability}`,
        kills: 20,
        perRun: 20_000,
        kill: { afterMs: [20, 400] },
        durability,
        subEntry: { size: 50, compression },
      });
      console.log(
        `[sub-entry crash ${durability}] runs=${result.runs} kills=${result.kills} attempted=${result.attempted} ` +
          `acknowledged=${result.acknowledged} resent=${result.resent} stream=${result.streamMessages} ` +
          formatReport(result.report),
      );
      expect(result.kills).toBe(20);
      expect(result.acknowledged).toBeGreaterThan(0);
      expect(result.report.lost).toEqual([]);
      expect(result.report.duplicated).toEqual([]);
      expect(result.report.unexpected).toEqual([]);
      expect(result.report.orderViolations).toEqual([]);
      expect(result.audit).toMatchObject({
        ok: true,
        gaps: 0,
        duplicates: 0,
        outOfOrder: 0,
        contradictions: 0,
      });
      if (durability === 'outbox') {
        expect(result.resent).toBeGreaterThan(0);
        expect(result.report.recovered.length).toBeGreaterThan(0);
      }
    }, 600_000);
  }
});
