import { describe, expect, it } from 'vitest';
import { formatReport } from '../../src/history/checker.js';
import { runCrashScenario } from '../../src/cli/crash.js';
import { uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';

// DESIGN §7: every message whose send() resolved is in the stream exactly once, no logical
// message twice, stream order = ID order — across SIGKILLs at random moments.
describe('publisher - crash and restart', () => {
  for (const durability of ['outbox', 'reserve'] as const) {
    it(`${durability}: 20 SIGKILLs at random moments lose no acknowledged message and duplicate none`, async () => {
      const result = await runCrashScenario({
        cli: CLI_FROM_SOURCE,
        stream: uniqueName(`crash-${durability}`),
        producerName: `crash-${durability}`,
        kills: 20,
        perRun: 20_000,
        minKillMs: 20,
        maxKillMs: 400,
        durability,
      });
      console.log(
        `[crash ${durability}] runs=${result.runs} kills=${result.kills} attempted=${result.attempted} ` +
          `acknowledged=${result.acknowledged} resent=${result.resent} stream=${result.streamMessages} ` +
          formatReport(result.report),
      );
      expect(result.kills).toBe(20);
      expect(result.acknowledged).toBeGreaterThan(0);
      expect(result.report.lost).toEqual([]);
      expect(result.report.duplicated).toEqual([]);
      expect(result.report.unexpected).toEqual([]);
      expect(result.report.orderViolations).toEqual([]);
      if (durability === 'outbox') {
        // The outbox re-sent what the kills left unconfirmed, and some of it reached the stream.
        expect(result.resent).toBeGreaterThan(0);
        expect(result.report.recovered.length).toBeGreaterThan(0);
      }
    }, 600_000);
  }
});
