import { describe, expect, it, vi } from 'vitest';
import { DedupError } from '../../src/errors.js';
import type { Client } from 'rabbitmq-stream-js-client';
import {
  explainDeclareFailure,
  isStreamNotAvailable,
  MissingStreamCheck,
  openThroughEndpoints,
  StreamDoesNotExistError,
  StreamNotAvailableError,
} from '../../src/transport/util.js';

// What rabbitmq-stream-js-client 1.0 throws, wrapped as the transports wrap it.
const notAvailable = (): DedupError =>
  new DedupError('DEDUP_BROKER_REFUSED', 'cannot consume stream "s"', {
    cause: new Error('Declare Consumer command returned error with code 6 - Stream not available'),
  });
const unreachable = (): DedupError => new DedupError('DEDUP_BROKER_UNREACHABLE', 'connect ECONNREFUSED');
const missing = (): DedupError =>
  new DedupError('DEDUP_BROKER_REFUSED', 'cannot consume stream "s"', {
    cause: new Error('Declare Consumer command returned error with code 2 - Stream does not exist'),
  });

/** An attempt that fails with each of `errors` in turn, then answers 'ok'. */
function scripted(errors: Array<() => Error>): { attempt: () => Promise<string>; calls: () => number } {
  let calls = 0;
  return {
    attempt: () => {
      const make = errors[calls++];
      return make === undefined ? Promise.resolve('ok') : Promise.reject(make());
    },
    calls: () => calls,
  };
}

describe('open() through endpoints', () => {
  it('recognises "stream not available" (code 6) through the cause chain, and nothing else', () => {
    expect(isStreamNotAvailable(notAvailable())).toBe(true);
    expect(isStreamNotAvailable(missing())).toBe(false);
    expect(isStreamNotAvailable(new Error('returned error with code 60 - x'))).toBe(false);
    expect(isStreamNotAvailable('code 6')).toBe(false);
  });

  it('skips endpoints that do not answer, once round the list', async () => {
    const ok = scripted([unreachable, unreachable]);
    await expect(openThroughEndpoints(3, ok.attempt)).resolves.toBe('ok');
    expect(ok.calls()).toBe(3);
    const down = scripted([unreachable, unreachable, unreachable, unreachable]);
    await expect(openThroughEndpoints(3, down.attempt)).rejects.toMatchObject({
      code: 'DEDUP_BROKER_UNREACHABLE',
    });
    expect(down.calls()).toBe(3);
  });

  it('waits out a stream that is not available, and fails at once for a missing stream', async () => {
    const electing = scripted([notAvailable, notAvailable]);
    await expect(openThroughEndpoints(1, electing.attempt)).resolves.toBe('ok');
    expect(electing.calls()).toBe(3);
    const gone = scripted([missing, missing]);
    await expect(openThroughEndpoints(3, gone.attempt)).rejects.toMatchObject({
      code: 'DEDUP_BROKER_REFUSED',
    });
    expect(gone.calls()).toBe(1);
  });
});

describe('"Stream was not found on any node", told apart by the stream metadata', () => {
  const noNode = new Error('Stream was not found on any node');
  const clientAnswering = (info: object | undefined): Client =>
    ({ queryMetadata: () => Promise.resolve(info === undefined ? [] : [info]) }) as unknown as Client;

  it('a missing stream (code 2) fails at once; a stream without a leader, a member that refuses or one that has not caught up, is waited for', async () => {
    const gone = await explainDeclareFailure(clientAnswering({ responseCode: 2, replicas: [] }), 's', noNode);
    expect(isStreamNotAvailable(gone)).toBe(false);
    expect((gone as Error).message).toBe('the stream does not exist');
    const electing = await explainDeclareFailure(
      clientAnswering({ responseCode: 6, replicas: [] }),
      's',
      noNode,
    );
    expect(electing).toBeInstanceOf(StreamNotAvailableError);
    expect(isStreamNotAvailable(electing)).toBe(true);
    // A member that refuses the connection (down, restarting) is waited for too.
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5563'), { code: 'ECONNREFUSED' });
    const down = await explainDeclareFailure(clientAnswering(undefined), 's', refused);
    expect(down).toBeInstanceOf(StreamNotAvailableError);
    expect((down as Error).message).toContain('ECONNREFUSED');
    // A member that says the stream does not exist (code 2) while the metadata lists it: a node
    // coming back from a partition. Waited for; only the metadata's own code 2 is final.
    const memberSays = new Error(
      'Declare Publisher command returned error with code 2 - Stream does not exist',
    );
    const behind = await explainDeclareFailure(
      clientAnswering({ responseCode: 1, replicas: [] }),
      's',
      memberSays,
    );
    expect(isStreamNotAvailable(behind)).toBe(true);
    const reallyGone = await explainDeclareFailure(
      clientAnswering({ responseCode: 2, replicas: [] }),
      's',
      memberSays,
    );
    expect((reallyGone as Error).message).toBe('the stream does not exist');
    // Any other error passes through unchanged.
    const other = new Error('boom');
    expect(await explainDeclareFailure(clientAnswering(undefined), 's', other)).toBe(other);
  });
});

describe('open() through endpoints, mixed answers', () => {
  it('a dead node met again after an election answer does not use up the round', async () => {
    // Three endpoints, one dead: the rotation meets it every third attempt while the others say
    // "not available"; four unreachable answers in all, never three in a row.
    const mixed = scripted([
      unreachable,
      notAvailable,
      notAvailable,
      unreachable,
      notAvailable,
      notAvailable,
      unreachable,
      unreachable,
    ]);
    await expect(openThroughEndpoints(3, mixed.attempt)).resolves.toBe('ok');
    expect(mixed.calls()).toBe(9);
  });
});

describe('"the stream does not exist" is believed when heard again: through another node, or later', () => {
  const gone = new StreamDoesNotExistError('the stream does not exist');

  it('through a second node it is final at once; a success or another failure starts over', () => {
    const check = new MissingStreamCheck();
    const first = check.judge(gone, 'a:5552');
    expect(first).toBeInstanceOf(StreamNotAvailableError);
    expect(isStreamNotAvailable(first)).toBe(true);
    expect((first as Error).cause).toBe(gone);
    expect(check.judge(gone, 'b:5552')).toBe(gone);
    check.succeeded();
    expect(check.judge(gone, 'a:5552')).toBeInstanceOf(StreamNotAvailableError);
    const other = new Error('boom');
    expect(check.judge(other, 'b:5552')).toBe(other);
    expect(check.judge(gone, 'b:5552')).toBeInstanceOf(StreamNotAvailableError);
    expect(check.judge(gone, 'c:5552')).toBe(gone);
  });

  it('through the same node (one endpoint, a shared client) it is final only once it has said so for SAME_NODE_MS', () => {
    vi.useFakeTimers({ toFake: ['performance'] });
    try {
      const check = new MissingStreamCheck();
      expect(check.judge(gone, 'a:5552')).toBeInstanceOf(StreamNotAvailableError);
      vi.advanceTimersByTime(MissingStreamCheck.SAME_NODE_MS - 1);
      expect(check.judge(gone, 'a:5552')).toBeInstanceOf(StreamNotAvailableError);
      vi.advanceTimersByTime(1);
      expect(check.judge(gone, 'a:5552')).toBe(gone);
    } finally {
      vi.useRealTimers();
    }
  });
});
