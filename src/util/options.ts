/**
 * Checks for option objects, each throwing with one message shape: "Expected <name> to be <what>,
 * got <value>". TypeError for a value of the wrong type, RangeError for a value of the right type
 * outside what is allowed. Options are checked before any I/O: a typo fails `open()` at once and
 * never silently becomes the default.
 */

/** A short, safe description of a value for an error message. */
export function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object') return 'an object';
  if (typeof value === 'symbol') return value.toString();
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  return 'undefined';
}

/** An optional option left out: `undefined`, or `null` (configurations merged from JSON carry it). */
export function absent(value: unknown): value is undefined | null {
  return value === undefined || value === null;
}

function fail(kind: 'type' | 'range', name: string, what: string, value: unknown): never {
  const message = `Expected ${name} to be ${what}, got ${describeValue(value)}`;
  throw kind === 'type' ? new TypeError(message) : new RangeError(message);
}

/** An object (not null, not an array). */
export function expectObject(value: unknown, name: string): asserts value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    fail('type', name, 'an object', value);
}

/** An optional object: absent (undefined or null), or an object. */
export function expectOptionalObject(
  value: unknown,
  name: string,
): asserts value is Record<string, unknown> | undefined | null {
  if (!absent(value)) expectObject(value, name);
}

/** An integer from `min` to `max` (inclusive); absent gives `fallback`. */
export function integerOption(
  value: unknown,
  name: string,
  fallback: number,
  min: number,
  max: number = Number.MAX_SAFE_INTEGER,
): number {
  if (absent(value)) return fallback;
  const what = max === Number.MAX_SAFE_INTEGER ? `an integer ≥ ${min}` : `an integer from ${min} to ${max}`;
  if (typeof value !== 'number') fail('type', name, what, value);
  if (!Number.isInteger(value) || value < min || value > max) fail('range', name, what, value);
  return value;
}

/** The longest delay a Node timer takes (about 24.8 days); a longer one would fire at once. */
export const MAX_TIMER_MS: number = 2 ** 31 - 1;

/**
 * A delay or timeout in ms that a timer waits for: an integer ≥ `min`; absent gives `fallback`;
 * anything above {@link MAX_TIMER_MS} waits that long (a timer cannot wait longer).
 */
export function timerOption(value: unknown, name: string, fallback: number, min: number): number {
  const ms = integerOption(value, name, fallback, min);
  return ms > MAX_TIMER_MS ? MAX_TIMER_MS : ms;
}

/** One of `choices`; absent gives `fallback`. */
export function choiceOption<T extends string>(
  value: unknown,
  name: string,
  choices: readonly T[],
  fallback: T,
): T {
  if (absent(value)) return fallback;
  const what = `one of ${choices.map((c) => `'${c}'`).join(', ')}`;
  if (typeof value !== 'string') fail('type', name, what, value);
  if (!(choices as readonly string[]).includes(value)) fail('range', name, what, value);
  return value as T;
}

/** A boolean; absent gives `fallback`. */
export function booleanOption(value: unknown, name: string, fallback: boolean): boolean {
  if (absent(value)) return fallback;
  if (typeof value !== 'boolean') fail('type', name, 'a boolean', value);
  return value;
}

/** A function (required). */
export function expectFunction(value: unknown, name: string): asserts value is (...args: never[]) => unknown {
  if (typeof value !== 'function') fail('type', name, 'a function', value);
}

/** An optional function: absent (undefined or null), or a function. */
export function expectOptionalFunction(
  value: unknown,
  name: string,
): asserts value is ((...args: never[]) => unknown) | undefined | null {
  if (!absent(value)) expectFunction(value, name);
}

/** Throws a TypeError in the common shape (for checks the helpers above do not cover). */
export function typeMismatch(name: string, what: string, value: unknown): never {
  fail('type', name, what, value);
}

/** Throws a RangeError in the common shape (for checks the helpers above do not cover). */
export function outOfRange(name: string, what: string, value: unknown): never {
  fail('range', name, what, value);
}
