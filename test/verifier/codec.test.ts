import { describe, expect, it } from 'vitest';
import { isDedupError } from '../../src/errors.js';
import {
  createTracker,
  decodeTracker,
  type PolicySpec,
  type SequenceTracker,
} from '../../src/verifier/index.js';

const MAX = 2n ** 64n - 1n;

function tracker(spec: PolicySpec, ...ids: bigint[]): SequenceTracker {
  const t = createTracker(spec);
  for (const id of ids) t.record(id);
  return t;
}

function hex(text: string): Uint8Array {
  return Uint8Array.from(Buffer.from(text.replace(/\s+/g, ''), 'hex'));
}

function expectCorrupt(bytes: Uint8Array): void {
  let thrown: unknown;
  try {
    decodeTracker(bytes);
  } catch (err) {
    thrown = err;
  }
  expect(isDedupError(thrown, 'DEDUP_STORE_CORRUPT'), `decoding ${Buffer.from(bytes).toString('hex')}`).toBe(
    true,
  );
}

/** A valid window(40) state at highest 100 with 61 and 100 recorded, floor 60. */
const WINDOW_40 = '01 02 00000028 0000000000000064 000000000000003c 0100000080';

describe('tracker codec', () => {
  it('codec - encodes a highest tracker as version, kind and the u64 highest', () => {
    expect(tracker({ kind: 'highest' }, 1n, 0x0102n).encode()).toEqual(hex('01 01 0000000000000102'));
    expect(tracker({ kind: 'highest' }).encode()).toEqual(hex('01 01 0000000000000000'));
  });

  it('codec - encodes a window tracker as size, highest, floor and the bitmap oldest first', () => {
    const t = tracker({ kind: 'window', size: 40 }, 61n, 100n);
    expect(Buffer.from(t.encode()).toString('hex')).toBe(WINDOW_40.replace(/\s+/g, ''));
  });

  it('codec - round-trips empty, in-order, reordered and jumped trackers of both kinds', () => {
    const cases: [PolicySpec, bigint[]][] = [
      [{ kind: 'highest' }, []],
      [{ kind: 'highest' }, [1n, 2n, 9n]],
      [{ kind: 'highest' }, [MAX]],
      [{ kind: 'window', size: 1 }, [3n]],
      [{ kind: 'window', size: 8 }, []],
      [{ kind: 'window', size: 8 }, [5n]],
      [{ kind: 'window', size: 13 }, [100n, 90n, 95n, 120n, 110n]],
      [{ kind: 'window', size: 64 }, [1n, 3n, 70n, 66n]],
      [{ kind: 'window', size: 100 }, [2n ** 63n, 2n ** 63n - 50n, MAX]],
      [{ kind: 'window', size: 65_536 }, [7n, 70_000n, 10_000n]],
    ];
    for (const [spec, ids] of cases) {
      const original = tracker(spec, ...ids);
      const decoded = decodeTracker(original.encode());
      expect(decoded.spec).toEqual(spec);
      expect(decoded.highest).toBe(original.highest);
      expect(decoded.encode()).toEqual(original.encode());
      const probes = [
        1n,
        2n,
        50n,
        99n,
        100n,
        101n,
        2n ** 63n - 50n,
        MAX - 1n,
        MAX,
        ...ids,
        ...ids.map((id) => id + 1n),
      ];
      for (const id of probes.filter((id) => id <= MAX)) {
        expect(decoded.check(id), `${spec.kind} ${String(ids)} check ${id}`).toEqual(original.check(id));
      }
    }
  });

  it('codec - a decoded window keeps its floor: ids below the first recorded never become gaps', () => {
    const original = tracker({ kind: 'window', size: 8 }, 100n);
    const decoded = decodeTracker(original.encode());
    expect(decoded.record(120n).confirmedGaps).toEqual([{ from: 101n, to: 112n }]);
    expect(original.record(120n).confirmedGaps).toEqual([{ from: 101n, to: 112n }]);
  });

  it('codec - decodes from a Buffer that is a slice of a larger pool', () => {
    const bytes = tracker({ kind: 'window', size: 40 }, 61n, 100n).encode();
    const pool = Buffer.alloc(bytes.length + 7);
    pool.set(bytes, 3);
    expect(decodeTracker(pool.subarray(3, 3 + bytes.length)).encode()).toEqual(bytes);
  });

  it('codec - accepts the largest window size', () => {
    const original = tracker({ kind: 'window', size: 1_048_576 }, 5n, 2_000_000n);
    const bytes = original.encode();
    // Buffer.equals: a deep toEqual over 128 KiB is needlessly slow.
    expect(Buffer.from(decodeTracker(bytes).encode()).equals(bytes)).toBe(true);
  });

  it('codec - refuses truncated input with DEDUP_STORE_CORRUPT', () => {
    const window = hex(WINDOW_40);
    const highest = hex('01 01 0000000000000102');
    for (let length = 0; length < window.length; length++) expectCorrupt(window.subarray(0, length));
    for (let length = 0; length < highest.length; length++) expectCorrupt(highest.subarray(0, length));
  });

  it('codec - refuses trailing bytes with DEDUP_STORE_CORRUPT', () => {
    expectCorrupt(hex('01 01 0000000000000102 00'));
    expectCorrupt(hex(`${WINDOW_40} 00`));
  });

  it('codec - refuses an unknown version or kind with DEDUP_STORE_CORRUPT', () => {
    expectCorrupt(hex('00 01 0000000000000102'));
    expectCorrupt(hex('02 01 0000000000000102'));
    expectCorrupt(hex('ff 01 0000000000000102'));
    expectCorrupt(hex('01 00 0000000000000102'));
    expectCorrupt(hex('01 03 0000000000000102'));
  });

  it('codec - refuses inconsistent window states with DEDUP_STORE_CORRUPT', () => {
    const bad = [
      '01 02 00000000 0000000000000064 000000000000003c', // size 0
      '01 02 00100001 0000000000000064 000000000000003c', // size 2^20 + 1 (and no bitmap)
      '01 02 00000028 0000000000000064 000000000000003c 0100000000', // highest itself not recorded
      '01 02 00000028 0000000000000064 0000000000000064 0100000080', // floor = highest
      '01 02 00000028 0000000000000064 000000000000003b 0100000080', // floor below highest - size
      '01 02 00000028 0000000000000000 0000000000000000 0000000080', // empty with a recorded id
      '01 02 00000028 0000000000000000 0000000000000001 0000000000', // empty with a floor
      '01 02 00000024 0000000000000064 0000000000000040 0100000018', // size 36: padding bit set
      '01 02 00000028 0000000000000005 0000000000000000 0100000080', // an id below 1 recorded
    ];
    for (const text of bad) expectCorrupt(hex(text));
  });

  it('codec - throws TypeError for something other than a Uint8Array', () => {
    expect(() => decodeTracker('0101' as unknown as Uint8Array)).toThrow(TypeError);
    expect(() => decodeTracker(undefined as unknown as Uint8Array)).toThrow(TypeError);
  });
});
