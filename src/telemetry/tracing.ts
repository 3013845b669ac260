/**
 * Tracing through `@opentelemetry/api`, after the OpenTelemetry messaging semantic conventions: a
 * no-op unless the application installs an SDK with a TracerProvider (and, for the trace context
 * to travel, a propagator: the SDK's default is W3C trace context).
 *
 * | span | kind | when | attributes |
 * |---|---|---|---|
 * | `send <stream>` | PRODUCER | `send()` to its confirm (or rejection) | `messaging.system` `rabbitmq`, `messaging.operation.type`/`.name` `send`, `messaging.destination.name`, `messaging.destination.partition.id` (super streams), `messaging.message.id` (the publishing ID), `stream_dedup.producer`, `stream_dedup.outcome` |
 * | `process <stream>` | CONSUMER | the handler of a new message | `messaging.system`, `messaging.operation.type`/`.name` `process`, `messaging.destination.name`, `messaging.consumer.group.name` (the consumer name), `messaging.message.id`, `stream_dedup.producer`, `stream_dedup.offset`; a link to the `send` span's context |
 * | `settle <stream>` | CLIENT | a batch's commit: effects, verifier state and offset | `messaging.system`, `messaging.operation.type`/`.name` `settle`, `messaging.destination.name`, `messaging.consumer.group.name`, `messaging.batch.message_count`, `stream_dedup.offset` (the batch's last) |
 *
 * The `send` span's context goes into the message's application properties (`traceparent`,
 * `tracestate`) through the global propagator, before the message is written to the outbox: a
 * re-send (after a reconnect, or by the next life after a crash) carries the original context.
 */
import {
  context,
  isSpanContextValid,
  propagation,
  ProxyTracerProvider,
  trace,
  SpanKind,
  SpanStatusCode,
  type Span,
  type Tracer,
  type TracerProvider,
} from '@opentelemetry/api';
import { libraryVersion } from './version.js';

type Headers = Readonly<Record<string, string | number>>;

let cached: { provider: TracerProvider; tracer: Tracer } | undefined;

/**
 * The library's tracer: the API's proxy, which follows a provider registered later; made again
 * when the global provider object changes (`trace.disable()` and a new SDK: tests, a restart of
 * the application's telemetry).
 */
function getTracer(): Tracer {
  const provider = trace.getTracerProvider();
  if (cached?.provider !== provider) {
    cached = { provider, tracer: provider.getTracer('stream-dedup', libraryVersion()) };
  }
  return cached.tracer;
}

const SYSTEM = 'rabbitmq';

/** The API's no-op provider: the delegate of its global proxy until an SDK registers a provider. */
const NOOP_PROVIDER = new ProxyTracerProvider().getDelegate();

/**
 * True while no SDK is registered (the global provider is the API's proxy, without a delegate):
 * every span would be a non-recording one. The `process` span is asked for per message, and making
 * that span cost ~250 ns a message (a loaded machine; issue 39, the group against the raw super
 * stream consumer). A provider of another copy of the API is not recognised: spans are then made.
 */
function noSdk(): boolean {
  const provider = trace.getTracerProvider();
  return provider instanceof ProxyTracerProvider && provider.getDelegate() === NOOP_PROVIDER;
}

/** Where a `send` goes: the stream (or AMQP queue), and for a super stream its partition. */
export interface SendTarget {
  readonly destination: string;
  readonly partition?: string | undefined;
  readonly producer: string;
}

/**
 * Runs `send` inside a `send` span whose context is added to the headers (unless the caller's
 * headers carry a `traceparent` already: theirs travels). Without an SDK nothing is added and
 * `send` is called as is. @internal
 */
export function traceSend<R extends { readonly publishingId: bigint; readonly outcome: string }>(
  target: SendTarget,
  headers: Headers | undefined,
  send: (headers: Headers | undefined) => Promise<R>,
): Promise<R> {
  const span = getTracer().startSpan(`send ${target.destination}`, { kind: SpanKind.PRODUCER });
  const recording = span.isRecording();
  // No SDK: a non-recording span with no valid context; nothing to record or propagate (this path
  // costs ~0.2 µs a send, see the notes' figures).
  if (!recording && !isSpanContextValid(span.spanContext())) return send(headers);
  let out = headers;
  // Headers that are not a plain object are the core's to refuse (a TypeError), untouched here.
  if (
    headers === undefined ||
    (typeof headers === 'object' && headers !== null && !('traceparent' in headers))
  ) {
    const carrier: Record<string, string> = {};
    propagation.inject(trace.setSpan(context.active(), span), carrier);
    if (carrier.traceparent !== undefined) out = { ...headers, ...carrier };
  }
  if (!recording) {
    span.end();
    return send(out);
  }
  span.setAttributes({
    'messaging.system': SYSTEM,
    'messaging.operation.type': 'send',
    'messaging.operation.name': 'send',
    'messaging.destination.name': target.destination,
    'stream_dedup.producer': target.producer,
  });
  if (target.partition !== undefined)
    span.setAttribute('messaging.destination.partition.id', target.partition);
  let sending: Promise<R>;
  try {
    sending = send(out);
  } catch (err) {
    fail(span, err);
    throw err;
  }
  return sending.then(
    (result) => {
      span.setAttribute('messaging.message.id', result.publishingId.toString());
      span.setAttribute('stream_dedup.outcome', result.outcome);
      span.end();
      return result;
    },
    (err: unknown) => {
      fail(span, err);
      throw err;
    },
  );
}

function fail(span: Span, err: unknown): void {
  if (err instanceof Error) span.recordException(err);
  span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
  span.end();
}

const getter = {
  keys: (carrier: Readonly<Record<string, unknown>>) => Object.keys(carrier),
  get: (carrier: Readonly<Record<string, unknown>>, key: string) => {
    const v = carrier[key];
    return typeof v === 'string' ? v : undefined;
  },
};

/** The message a `process` span is about (the consumer's `VerifiedMessage`). @internal */
export interface ProcessedMessage {
  readonly identity: { readonly producerName: string; readonly publishingId: bigint } | undefined;
  readonly offset: bigint;
  /** Read only when a span records (merging them costs). */
  readonly headers: Readonly<Record<string, unknown>>;
}

/**
 * Runs `handler` in a `process` span (active, so the handler's own spans are its children) linked
 * to the context the message carries. The handler's throw or rejection is recorded and passed on.
 * Without an SDK, `handler` runs as is. @internal
 */
export function traceProcess<T>(
  destination: string | undefined,
  consumer: string,
  message: ProcessedMessage,
  handler: () => T,
): T {
  if (noSdk()) return handler();
  const span = getTracer().startSpan(`process ${destination ?? consumer}`, {
    kind: SpanKind.CONSUMER,
  });
  // Without an SDK the span records nothing: the message's headers are not merged and parsed.
  if (!span.isRecording()) {
    span.end();
    return handler();
  }
  span.setAttributes({
    'messaging.system': SYSTEM,
    'messaging.operation.type': 'process',
    'messaging.operation.name': 'process',
    'messaging.consumer.group.name': consumer,
    'stream_dedup.offset': message.offset.toString(),
  });
  if (destination !== undefined) span.setAttribute('messaging.destination.name', destination);
  const identity = message.identity;
  if (identity !== undefined) {
    span.setAttribute('messaging.message.id', identity.publishingId.toString());
    span.setAttribute('stream_dedup.producer', identity.producerName);
  }
  const parent = trace.getSpanContext(propagation.extract(context.active(), message.headers, getter));
  if (parent !== undefined) span.addLink({ context: parent });
  let result: T;
  try {
    result = context.with(trace.setSpan(context.active(), span), handler);
  } catch (err) {
    fail(span, err);
    throw err;
  }
  if (result instanceof Promise) {
    return result.then(
      (v: unknown) => {
        span.end();
        return v;
      },
      (err: unknown) => {
        fail(span, err);
        throw err;
      },
    ) as T;
  }
  span.end();
  return result;
}

/**
 * Starts a `settle` span for a batch's commit; the returned function ends it (with the error when
 * the write failed) and records a durable write's duration. @internal
 */
export function startSettle(
  destination: string | undefined,
  consumer: string,
  messages: number,
  lastOffset: bigint,
  recordDuration?: (ms: number) => void,
): (err?: unknown) => void {
  const started = performance.now();
  const span = getTracer().startSpan(`settle ${destination ?? consumer}`, {
    kind: SpanKind.CLIENT,
    attributes: {
      'messaging.system': SYSTEM,
      'messaging.operation.type': 'settle',
      'messaging.operation.name': 'settle',
      ...(destination === undefined ? {} : { 'messaging.destination.name': destination }),
      'messaging.consumer.group.name': consumer,
      'messaging.batch.message_count': messages,
      'stream_dedup.offset': lastOffset.toString(),
    },
  });
  return (err) => {
    if (err !== undefined) return fail(span, err);
    span.end();
    recordDuration?.(performance.now() - started);
  };
}
