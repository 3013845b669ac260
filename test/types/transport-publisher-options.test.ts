import { describe, expect, expectTypeOf, it } from 'vitest';
import { DedupError } from '../../src/errors.js';
import { resolvePublisherOptions } from '../../src/publisher/options.js';
import {
  resolveAmqpPublisherOptions,
  type AmqpAutoPublisherOptions,
  type AmqpDedupPublisherOptions,
  type AmqpOutboxPublisherOptions,
} from '../../src/transport/amqp-options.js';
import type {
  StreamDedupPublisherOptions,
  StreamKeyedPublisherOptions,
  StreamNumberedPublisherOptions,
} from '../../src/transport/stream-options.js';
import { thrown } from '../support/thrown.js';

// Type tests (see publisher-options.test.ts): each `@ts-expect-error` fails the type check once the
// types accept what it marks, and each case also runs against open()'s own check (the stream
// publisher's is resolvePublisherOptions, before any I/O).

const code = (f: () => unknown): string | undefined => {
  const err = thrown(f);
  return err instanceof DedupError ? err.code : String(err);
};
const stream = { stream: 's', producerName: 'p', store: '/tmp/never-opened' } as const;
const amqp = {
  url: 'amqp://127.0.0.1:1',
  queue: 'q',
  producerName: 'p',
  store: '/tmp/never-opened',
} as const;

describe('types - StreamDedupPublisherOptions: keyed IDs need the outbox', () => {
  it("refuses keyed IDs with 'reserve'", () => {
    // @ts-expect-error keyed IDs with 'reserve'
    const keyedReserve: StreamDedupPublisherOptions = { ...stream, idMode: 'keyed', durability: 'reserve' };
    expect(code(() => resolvePublisherOptions(keyedReserve))).toBe('DEDUP_UNSAFE_OPTIONS');
  });

  it('takes every other combination', () => {
    const ok: StreamDedupPublisherOptions[] = [
      { ...stream },
      { ...stream, durability: 'reserve' },
      { ...stream, idMode: 'explicit', durability: 'reserve' },
      { ...stream, idMode: 'keyed' },
      { ...stream, idMode: 'keyed', durability: 'outbox' },
    ];
    for (const o of ok) expect(resolvePublisherOptions(o).producerName).toBe('p');
    expectTypeOf<StreamDedupPublisherOptions>().toEqualTypeOf<
      StreamNumberedPublisherOptions | StreamKeyedPublisherOptions
    >();
  });
});

describe('types - AmqpDedupPublisherOptions: explicit and keyed IDs need the outbox', () => {
  it("refuses explicit or keyed IDs with 'reserve'", () => {
    // @ts-expect-error explicit IDs with 'reserve': AMQP 0-9-1 cannot report the broker's last ID
    const explicit: AmqpDedupPublisherOptions = { ...amqp, idMode: 'explicit', durability: 'reserve' };
    expect(code(() => resolveAmqpPublisherOptions(explicit))).toBe('DEDUP_UNSAFE_OPTIONS');
    // @ts-expect-error keyed IDs with 'reserve'
    const keyed: AmqpDedupPublisherOptions = { ...amqp, idMode: 'keyed', durability: 'reserve' };
    expect(code(() => resolveAmqpPublisherOptions(keyed))).toBe('DEDUP_UNSAFE_OPTIONS');
  });

  it('takes every other combination', () => {
    const ok: AmqpDedupPublisherOptions[] = [
      { ...amqp },
      { ...amqp, durability: 'reserve' },
      { ...amqp, idMode: 'auto', durability: 'reserve' },
      { ...amqp, idMode: 'explicit' },
      { ...amqp, idMode: 'keyed', durability: 'outbox' },
    ];
    for (const o of ok) expect(resolveAmqpPublisherOptions(o).queue).toBe('q');
    expectTypeOf<AmqpDedupPublisherOptions>().toEqualTypeOf<
      AmqpAutoPublisherOptions | AmqpOutboxPublisherOptions
    >();
  });
});
