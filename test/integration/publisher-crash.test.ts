import { describe, expect, it } from 'vitest';
import { formatReport } from '../../src/testing.js';
import { runCrashScenario } from '../../src/cli/crash.js';
import { uniqueName } from '../support/broker.js';
import { CLI_FROM_SOURCE } from '../support/cli.js';

// docs/design.md §7: every message whose send() resolved is in the stream exactly once, no logical
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
        kill: { afterMs: [20, 400] },
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
      // The audit sees what the history checker sees, and no false alarm: every hole the kills
      // left in reserve durability (the rest of a reserved block) is declared by the producer.
      const [audited] = result.audit.producers;
      console.log(
        `[crash ${durability}] audit: ${result.audit.ok ? 'OK' : 'FAILED'}, gaps=${result.audit.gaps}, ` +
          `skipped ids=${result.audit.skippedIds} in ${audited?.skippedRanges.length ?? 0}+ ranges ` +
          `(${audited?.skippedRanges.map((r) => `${r.from}..${r.to}`).join(', ')})`,
      );
      expect(result.audit).toMatchObject({
        ok: true,
        gaps: 0,
        duplicates: 0,
        outOfOrder: 0,
        contradictions: 0,
      });
      if (durability === 'reserve') expect(result.audit.skippedIds).toBeGreaterThan(0n);
      else expect(result.audit.skippedIds).toBe(0n);
      if (durability === 'outbox') {
        // The outbox re-sent what the kills left unconfirmed, and some of it reached the stream.
        expect(result.resent).toBeGreaterThan(0);
        expect(result.report.recovered.length).toBeGreaterThan(0);
      }
    }, 600_000);
  }

  it('keyed: a producer re-sending keys k-1..k-N from the start after each of 10 SIGKILLs leaves each key once', async () => {
    const result = await runCrashScenario({
      cli: CLI_FROM_SOURCE,
      stream: uniqueName('crash-keyed'),
      producerName: 'crash-keyed',
      keyed: true,
      kills: 10,
      perRun: 20_000,
      kill: { afterMs: [20, 300] },
    });
    console.log(
      `[crash keyed] runs=${result.runs} kills=${result.kills} acknowledged=${result.acknowledged} ` +
        `stream=${result.streamMessages} ${formatReport(result.report)}`,
    );
    expect(result.kills).toBe(10);
    // The last run finished: every key was acknowledged (published or a duplicate) and is there once.
    expect(new Set(result.acknowledgedLabels).size).toBe(20_000);
    expect(result.streamMessages).toBe(20_000);
    expect(result.report.lost).toEqual([]);
    expect(result.report.duplicated).toEqual([]);
    expect(result.report.unexpected).toEqual([]);
    expect(result.report.orderViolations).toEqual([]);
  }, 600_000);
});
