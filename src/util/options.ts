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

function fail(kind: 'type' | 'range', name: string, what: string, value: unknown): never {
  const message = `Expected ${name} to be ${what}, got ${describeValue(value)}`;
  throw kind === 'type' ? new TypeError(message) : new RangeError(message);
}

/** An object (not null, not an array). */
export function expectObject(value: unknown, name: string): asserts value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    fail('type', name, 'an object', value);
}

/** An optional object: undefined, or an object. */
export function expectOptionalObject(
  value: unknown,
  name: string,
): asserts value is Record<string, unknown> | undefined {
  if (value !== undefined) expectObject(value, name);
}

/** An integer from `min` to `max` (inclusive); `undefined` gives `fallback`. */
export function integerOption(
  value: unknown,
  name: string,
  fallback: number,
  min: number,
  max: number = Number.MAX_SAFE_INTEGER,
): number {
  if (value === undefined) return fallback;
  const what = max === Number.MAX_SAFE_INTEGER ? `an integer ≥ ${min}` : `an integer from ${min} to ${max}`;
  if (typeof value !== 'number') fail('type', name, what, value);
  if (!Number.isInteger(value) || value < min || value > max) fail('range', name, what, value);
  return value;
}

/** One of `choices`; `undefined` gives `fallback`. */
export function choiceOption<T extends string>(
  value: unknown,
  name: string,
  choices: readonly T[],
  fallback: T,
): T {
  if (value === undefined) return fallback;
  const what = `one of ${choices.map((c) => `'${c}'`).join(', ')}`;
  if (typeof value !== 'string') fail('type', name, what, value);
  if (!(choices as readonly string[]).includes(value)) fail('range', name, what, value);
  return value as T;
}

/** A boolean; `undefined` gives `fallback`. */
export function booleanOption(value: unknown, name: string, fallback: boolean): boolean {
  if (value === undefined) return fallback;
  if (typeof value !== 'boolean') fail('type', name, 'a boolean', value);
  return value;
}

/** A function (required). */
export function expectFunction(value: unknown, name: string): asserts value is (...args: never[]) => unknown {
  if (typeof value !== 'function') fail('type', name, 'a function', value);
}

/** An optional function: undefined, or a function. */
export function expectOptionalFunction(
  value: unknown,
  name: string,
): asserts value is ((...args: never[]) => unknown) | undefined {
  if (value !== undefined) expectFunction(value, name);
}

/** Throws a TypeError in the common shape (for checks the helpers above do not cover). */
export function typeMismatch(name: string, what: string, value: unknown): never {
  fail('type', name, what, value);
}

/** Throws a RangeError in the common shape (for checks the helpers above do not cover). */
export function outOfRange(name: string, what: string, value: unknown): never {
  fail('range', name, what, value);
}
