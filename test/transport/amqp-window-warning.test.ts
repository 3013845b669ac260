import { describe, expect, it } from 'vitest';
import { resolveVerifyingConsumerOptions } from '../../src/consumer/options.js';
import { resolvePublisherOptions } from '../../src/publisher/options.js';
import { PUBLISHER_DEFAULT_MAX_IN_FLIGHT, windowWarning } from '../../src/transport/amqp-consumer.js';

// Issue 36, item 5: the AMQP verifying consumer's default window (1 024) is below the publishers'
// default maxInFlight (5 000), so a routine crash of an AMQP publisher raised `stale` events.
describe('AmqpVerifyingConsumer - window below the publishers in-flight bound', () => {
  it('the bound is the publishers default maxInFlight', () => {
    const publisher = resolvePublisherOptions({ producerName: 'p', store: '/tmp/never-opened' });
    expect(PUBLISHER_DEFAULT_MAX_IN_FLIGHT).toBe(publisher.maxInFlight);
  });

  it('warns for the default window and any window below it; not at or above it, nor for highest', () => {
    const defaults = resolveVerifyingConsumerOptions({
      consumerName: 'c',
      store: '/tmp/never-opened',
      handler: () => undefined,
    });
    expect(windowWarning(defaults.policy)).toMatch(
      /^policy window\(1024\) is below the publishers' default maxInFlight \(5000\)/,
    );
    expect(windowWarning({ kind: 'window', size: 4_999 })).toBeDefined();
    expect(windowWarning({ kind: 'window', size: 5_000 })).toBeUndefined();
    expect(windowWarning({ kind: 'window', size: 8_192 })).toBeUndefined();
    expect(windowWarning({ kind: 'highest' })).toBeUndefined();
  });
});
