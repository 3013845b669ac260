/**
 * The binary form of a tracker's state (what the consumer stores next to its effect).
 *
 * Integers big-endian:
 *
 * ```
 * highest:  u8 version=1 | u8 kind=1 | u64 highest                                  (10 bytes)
 * window:   u8 version=1 | u8 kind=2 | u32 size | u64 highest | u64 floor | bitmap  (22 + ceil(size/8))
 * window with declared skips (since 0.2.0):
 *           u8 version=2 | u8 kind=2 | u32 size | u64 highest | u64 floor | bitmap
 *           | u32 count | count * (u64 from | u64 to)
 * ```
 *
 * Declared skips are the ID ranges a producer declared it never used (`x-dedup-skip-from`) that
 * still reach into the window, as declared: ascending, disjoint, not adjacent, `1 <= from <= to`,
 * `highest - size < to < highest`, from 1 to 32 of them (a tracker without any writes version 1,
 * so states written before 0.2.0 and the common case are unchanged). 0.1 cannot read version 2:
 * roll a consumer back only with a store written while no scope held a declared skip.
 *
 * The bitmap holds `size` bits in ascending ID order: bit `j` (byte `j >> 3`, bit `j & 7`, least
 * significant first) is set iff ID `highest - size + 1 + j` was recorded, so the last bit is
 * `highest` itself. Padding bits are zero. `floor` is the first recorded ID minus one, clamped up to
 * `highest - size` (IDs at or below either are never reported as gaps); `highest = 0` is the empty
 * tracker, with `floor = 0` and no bit set.
 *
 * Decoding is strict: every valid state has exactly one encoding, and anything else (truncated,
 * trailing bytes, unknown version or kind, out-of-range fields, bits for IDs that cannot exist) is
 * refused with `DEDUP_STORE_CORRUPT`. This module knows bytes only; the trackers build on it.
 */
import { DedupError } from '../errors.js';
import { MAX_DECLARED_RANGES, MAX_WINDOW_SIZE, type IdRange } from './types.js';

/** The format version of every state without declared skips. @internal */
export const FORMAT_VERSION = 1;
/** The format version of a window state with declared skips. @internal */
const FORMAT_VERSION_SKIPS = 2;

const KIND_HIGHEST = 1;
const KIND_WINDOW = 2;
const HIGHEST_LENGTH = 10;
const WINDOW_HEADER = 22;

/** The decoded state of a tracker, checked for consistency. @internal */
export type TrackerState =
  | { readonly kind: 'highest'; readonly highest: bigint }
  | {
      readonly kind: 'window';
      readonly size: number;
      readonly highest: bigint;
      readonly floor: bigint;
      /** `ceil(size / 32)` words; bit `j` of the bitmap is bit `j & 31` of word `j >>> 5`. */
      readonly words: Uint32Array;
      /** Declared skips reaching into the window (possibly none). */
      readonly declared: readonly IdRange[];
    };

/** Encodes the state of a `highest` tracker. @internal */
export function encodeHighestState(highest: bigint): Uint8Array {
  const bytes = new Uint8Array(HIGHEST_LENGTH);
  const view = new DataView(bytes.buffer);
  view.setUint8(0, FORMAT_VERSION);
  view.setUint8(1, KIND_HIGHEST);
  view.setBigUint64(2, highest);
  return bytes;
}

/**
 * Encodes the state of a `window` tracker; `words` is the bitmap as described above, padding bits
 * zero. @internal
 */
export function encodeWindowState(
  size: number,
  highest: bigint,
  floor: bigint,
  words: Uint32Array,
  declared?: readonly IdRange[],
): Uint8Array {
  const bitmapLength = Math.ceil(size / 8);
  const skips = declared === undefined || declared.length === 0 ? 0 : 4 + 16 * declared.length;
  const bytes = new Uint8Array(WINDOW_HEADER + bitmapLength + skips);
  const view = new DataView(bytes.buffer);
  view.setUint8(0, skips === 0 ? FORMAT_VERSION : FORMAT_VERSION_SKIPS);
  view.setUint8(1, KIND_WINDOW);
  view.setUint32(2, size);
  view.setBigUint64(6, highest);
  view.setBigUint64(14, floor);
  for (let i = 0; i < bitmapLength; i++) {
    bytes[WINDOW_HEADER + i] = (words[i >>> 2]! >>> ((i & 3) << 3)) & 0xff;
  }
  if (skips !== 0) {
    let at = WINDOW_HEADER + bitmapLength;
    view.setUint32(at, declared!.length);
    at += 4;
    for (const range of declared!) {
      view.setBigUint64(at, range.from);
      view.setBigUint64(at + 8, range.to);
      at += 16;
    }
  }
  return bytes;
}

/**
 * Decodes and checks a state written by {@link encodeHighestState} or {@link encodeWindowState}.
 *
 * @throws TypeError when `bytes` is not a Uint8Array.
 * @throws DedupError `DEDUP_STORE_CORRUPT` for anything that is not a valid encoding.
 * @internal
 */
export function decodeTrackerState(bytes: Uint8Array): TrackerState {
  if (!(bytes instanceof Uint8Array)) {
    throw new TypeError(`tracker state must be a Uint8Array, got ${typeof bytes}`);
  }
  if (bytes.length < 2) corrupt(`${bytes.length} bytes is too short for a tracker state`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = view.getUint8(0);
  if (version !== FORMAT_VERSION && version !== FORMAT_VERSION_SKIPS) {
    corrupt(`unknown tracker state version ${version}`);
  }
  const kind = view.getUint8(1);
  if (kind === KIND_HIGHEST) {
    if (version !== FORMAT_VERSION) corrupt(`a highest state has version ${version}`);
    expectLength(bytes, HIGHEST_LENGTH, 'highest');
    return { kind: 'highest', highest: view.getBigUint64(2) };
  }
  if (kind !== KIND_WINDOW) corrupt(`unknown tracker kind ${kind}`);
  if (bytes.length < WINDOW_HEADER) corrupt(`${bytes.length} bytes is too short for a window state`);
  const size = view.getUint32(2);
  if (size < 1 || size > MAX_WINDOW_SIZE) corrupt(`window size ${size} is out of range`);
  const bitmapEnd = WINDOW_HEADER + Math.ceil(size / 8);
  if (version === FORMAT_VERSION) expectLength(bytes, bitmapEnd, `window(${size})`);
  else if (bytes.length < bitmapEnd + 4)
    corrupt(`${bytes.length} bytes is too short for window(${size}) with skips`);
  const highest = view.getBigUint64(6);
  const floor = view.getBigUint64(14);
  const words = new Uint32Array(Math.ceil(size / 32));
  for (let i = WINDOW_HEADER; i < bitmapEnd; i++) {
    const j = i - WINDOW_HEADER;
    words[j >>> 2]! |= bytes[i]! << ((j & 3) << 3);
  }
  if (words.length * 32 > size && words[words.length - 1]! >>> (size & 31) !== 0) {
    corrupt('window bitmap has padding bits set');
  }
  if (highest === 0n) {
    if (floor !== 0n) corrupt('empty window state with a floor');
    if (words.some((word) => word !== 0)) corrupt('empty window state with recorded IDs');
  } else {
    const lowest = highest - BigInt(size); // the ID just left of the window (may be negative)
    if (floor >= highest || floor < (lowest > 0n ? lowest : 0n)) {
      corrupt(`window floor ${floor} is inconsistent with highest ${highest}`);
    }
    if (bitAt(words, size - 1) === 0) corrupt('window state does not have its highest ID recorded');
    // Bits for IDs <= 0 (the first `size - highest` bits when highest < size) must be clear.
    if (highest < BigInt(size) && hasBitBelow(words, size - Number(highest))) {
      corrupt('window bitmap records IDs below 1');
    }
  }
  const declared = version === FORMAT_VERSION ? [] : decodeDeclared(view, bitmapEnd, size, highest);
  return { kind: 'window', size, highest, floor, words, declared };
}

/** The declared skips after a version 2 window's bitmap, checked as the format requires. */
function decodeDeclared(view: DataView, at: number, size: number, highest: bigint): IdRange[] {
  const count = view.getUint32(at);
  if (count < 1 || count > MAX_DECLARED_RANGES) corrupt(`${count} declared skips in window(${size})`);
  if (view.byteLength !== at + 4 + 16 * count) {
    corrupt(
      `window(${size}) with ${count} skips must be ${at + 4 + 16 * count} bytes, got ${view.byteLength}`,
    );
  }
  const lowest = highest - BigInt(size) + 1n;
  const declared: IdRange[] = [];
  let previous = 0n;
  for (let i = 0, p = at + 4; i < count; i++, p += 16) {
    const from = view.getBigUint64(p);
    const to = view.getBigUint64(p + 8);
    if (from < 1n || from > to || to < lowest || to >= highest || (i > 0 && from <= previous + 1n)) {
      corrupt(`declared skip ${from}..${to} is out of order or outside the window`);
    }
    declared.push({ from, to });
    previous = to;
  }
  return declared;
}

function bitAt(words: Uint32Array, j: number): number {
  return (words[j >>> 5]! >>> (j & 31)) & 1;
}

/** True when any of bits `0 .. count - 1` is set. */
function hasBitBelow(words: Uint32Array, count: number): boolean {
  const full = count >>> 5;
  for (let i = 0; i < full; i++) if (words[i] !== 0) return true;
  const rest = count & 31;
  return rest !== 0 && (words[full]! & ((1 << rest) - 1)) !== 0;
}

function expectLength(bytes: Uint8Array, expected: number, what: string): void {
  if (bytes.length !== expected) {
    corrupt(`${what} state must be ${expected} bytes, got ${bytes.length}`);
  }
}

function corrupt(reason: string): never {
  throw new DedupError('DEDUP_STORE_CORRUPT', `undecodable sequence tracker state: ${reason}`);
}
