import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { propagation, trace } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type IdGenerator,
} from '@opentelemetry/sdk-trace-base';

/**
 * Installs an OpenTelemetry trace SDK globally (W3C trace context propagator, every span kept in
 * memory); `uninstall` restores the no-op API.
 */
export function installTracing(idGenerator?: IdGenerator): {
  exporter: InMemorySpanExporter;
  uninstall: () => Promise<void>;
} {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({
    spanProcessors: [new SimpleSpanProcessor(exporter)],
    ...(idGenerator === undefined ? {} : { idGenerator }),
  });
  trace.setGlobalTracerProvider(provider);
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  return {
    exporter,
    uninstall: async () => {
      await provider.shutdown();
      trace.disable();
      propagation.disable();
    },
  };
}

/** An ID generator whose trace ID is always `traceId` (a child process's trace, known in advance). */
export function fixedTraceIds(traceId: string): IdGenerator {
  let n = 0;
  return {
    generateTraceId: () => traceId,
    generateSpanId: () => (++n).toString(16).padStart(16, '0'),
  };
}
