/**
 * The consumer's per-message `process` span (telemetry/tracing.ts): without an SDK it is not even
 * made — the no-op span, its name and options cost ~250 ns a message on the group's path (issue
 * 39) — and an SDK registered later, or again after `trace.disable()`, is followed at once.
 */
import { ProxyTracer } from '@opentelemetry/api';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { traceProcess } from '../../src/telemetry/tracing.js';
import { installTracing } from '../support/tracing.js';

const message = { identity: { producerName: 'orders-svc', publishingId: 7n }, offset: 3n, headers: {} };

afterEach(() => vi.restoreAllMocks());

describe('the process span', () => {
  it('without an SDK: no span is made, the handler runs and its result is returned', () => {
    const startSpan = vi.spyOn(ProxyTracer.prototype, 'startSpan');
    let ran = 0;
    for (let i = 0; i < 3; i++) expect(traceProcess('orders-0', 'billing', message, () => ++ran)).toBe(i + 1);
    expect(ran).toBe(3);
    expect(startSpan).not.toHaveBeenCalled();
  });

  it('an SDK registered later records the span; after it is removed none is made again', async () => {
    const { exporter, uninstall } = installTracing();
    try {
      traceProcess('orders-0', 'billing', message, () => undefined);
      expect(exporter.getFinishedSpans().map((s) => s.name)).toEqual(['process orders-0']);
    } finally {
      await uninstall();
    }
    const startSpan = vi.spyOn(ProxyTracer.prototype, 'startSpan');
    traceProcess('orders-0', 'billing', message, () => undefined);
    expect(startSpan).not.toHaveBeenCalled();
  });
});
