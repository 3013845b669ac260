import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { INSTRUMENTS, type InstrumentInfo } from '../../src/telemetry/metrics.js';

/** The Prometheus exporter's names of an instrument's series. */
function seriesNames(i: InstrumentInfo): string[] {
  const base = i.name.replaceAll('.', '_');
  if (i.kind === 'counter') return [`${base}_total`];
  if (i.kind === 'histogram') return [`${base}_bucket`, `${base}_count`, `${base}_sum`];
  return [base];
}

const SERIES = new Map(INSTRUMENTS.flatMap((i) => seriesNames(i).map((s) => [s, i] as const)));

interface Query {
  readonly where: string;
  readonly expr: string;
  readonly legend?: string;
}

function queries(): Query[] {
  const dashboard = JSON.parse(
    readFileSync(new URL('../../docs/grafana-dashboard.json', import.meta.url), 'utf8'),
  ) as {
    panels: Array<{ title: string; targets: Array<{ expr: string; legendFormat?: string }> }>;
    templating: { list: Array<{ name: string; query: unknown }> };
  };
  const out: Query[] = [];
  for (const p of dashboard.panels) {
    for (const t of p.targets) {
      out.push({
        where: p.title,
        expr: t.expr,
        ...(t.legendFormat === undefined ? {} : { legend: t.legendFormat }),
      });
    }
  }
  for (const v of dashboard.templating.list) {
    if (typeof v.query === 'string' && v.query.includes('stream_dedup'))
      out.push({ where: `$${v.name}`, expr: v.query });
  }
  return out;
}

/** The labels a query reads: `by (…)`, matchers `{label=~…}`, `label_values(m, label)`, `{{label}}` in the legend. */
function labelsOf(q: Query): string[] {
  const labels = new Set<string>();
  for (const m of q.expr.matchAll(/\b(?:by|without)\s*\(([^)]*)\)/g)) {
    for (const l of m[1]!.split(',')) if (l.trim() !== '') labels.add(l.trim());
  }
  for (const m of q.expr.matchAll(/\{([^}]*)\}/g)) {
    for (const matcher of m[1]!.split(',')) {
      const name = /^\s*([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)/.exec(matcher)?.[1];
      if (name !== undefined) labels.add(name);
    }
  }
  for (const m of q.expr.matchAll(/label_values\(\s*\w+\s*,\s*(\w+)\s*\)/g)) labels.add(m[1]!);
  for (const m of (q.legend ?? '').matchAll(/\{\{\s*(\w+)\s*\}\}/g)) labels.add(m[1]!);
  return [...labels];
}

describe('docs/grafana-dashboard.json', () => {
  const all = queries();

  it('has queries, each on at least one of the library metrics', () => {
    expect(all.length).toBeGreaterThan(8);
    for (const q of all) expect(q.expr, q.where).toMatch(/stream_dedup_/);
  });

  it('queries only metrics the library emits, by labels those metrics carry (INSTRUMENTS, as the metrics test checks)', () => {
    const problems: string[] = [];
    for (const q of all) {
      const metrics = [...q.expr.matchAll(/\bstream_dedup_\w+/g)].map((m) => m[0]);
      for (const name of metrics) {
        const instrument = SERIES.get(name);
        if (instrument === undefined) {
          problems.push(`${q.where}: ${name} is not emitted`);
          continue;
        }
        const allowed = new Set([...instrument.attributes, ...(name.endsWith('_bucket') ? ['le'] : [])]);
        for (const label of labelsOf(q)) {
          if (!allowed.has(label)) problems.push(`${q.where}: ${name} has no label "${label}"`);
        }
      }
    }
    expect(problems).toEqual([]);
  });

  it('would catch a renamed metric or a label the library does not set (the check can fail)', () => {
    const renamed: Query = { where: 'test', expr: 'rate(stream_dedup_publisher_confirms_total[5m])' };
    expect([...renamed.expr.matchAll(/\bstream_dedup_\w+/g)].map((m) => SERIES.has(m[0]))).toEqual([false]);
    expect(labelsOf({ where: 'test', expr: 'sum by (stream) (stream_dedup_publisher_in_flight)' })).toEqual([
      'stream',
    ]);
    expect(SERIES.get('stream_dedup_publisher_in_flight')!.attributes).not.toContain('stream');
  });
});
