/**
 * The verifying consumer's options, resolved before any I/O: defaults merged into one frozen,
 * fully-typed object and every option checked ("Expected <name> to be <what>, got <value>":
 * TypeError for a wrong type, RangeError for a value out of range), so that a typo fails `open()`
 * at once instead of silently becoming the default.
 */
import { measureUtf8 } from '../identity/utf8.js';
import { DedupStore } from '../store/store.js';
import { isConsumerStoreProvider, type ConsumerStoreProvider } from './consumer-store.js';
import { resolveLogger, type Logger } from '../telemetry/logger.js';
import {
  booleanOption,
  choiceOption,
  expectFunction,
  expectObject,
  expectOptionalFunction,
  expectOptionalObject,
  integerOption,
  timerOption,
  outOfRange,
  typeMismatch,
} from '../util/options.js';
import { checkPolicySpec, MAX_WINDOW_SIZE, type PolicySpec } from '../verifier/types.js';
import type { MessageHandler, SubscriptionOptions, VerifyEvent, VerifyingConsumerOptions } from './types.js';

const DEFAULT_POLICY: PolicySpec = Object.freeze({ kind: 'window', size: 1024 });

/** {@link VerifyingConsumerOptions} with every default applied, checked and frozen. */
export interface ResolvedVerifyingConsumerOptions {
  readonly consumerName: string;
  readonly store: string | DedupStore | ConsumerStoreProvider;
  readonly sync: boolean;
  readonly handler: MessageHandler;
  readonly policy: PolicySpec;
  readonly tenant: ((message: { readonly headers: Readonly<Record<string, unknown>> }) => string) | undefined;
  readonly unidentified: 'reject' | 'pass-through';
  readonly commit: 'message' | 'batch';
  readonly commitEvery: number;
  readonly commitLingerMs: number;
  readonly scopeTtlMs: number;
  readonly onEvent: ((event: VerifyEvent) => void) | undefined;
  readonly logger: Logger;
  readonly hooks: VerifyingConsumerOptions['hooks'];
}

/** {@link SubscriptionOptions} with every default applied, checked and frozen. */
export interface ResolvedSubscriptionOptions {
  readonly startFrom: 'first' | 'next';
  readonly reconnect: { readonly initialDelayMs: number; readonly maxDelayMs: number };
  readonly connectTimeoutMs: number;
}

/** Objects this module returned: resolving one again returns it as it is. */
const resolved = new WeakSet<object>();

/**
 * Checks `options` and returns them with their defaults, frozen. Pure: opens nothing.
 *
 * @throws TypeError when an option has the wrong type.
 * @throws RangeError when an option is out of range.
 */
export function resolveVerifyingConsumerOptions(
  options: VerifyingConsumerOptions,
): ResolvedVerifyingConsumerOptions {
  if (resolved.has(options)) return options as ResolvedVerifyingConsumerOptions;
  expectObject(options, 'options');
  const consumerName = nonEmptyString(options.consumerName, 'consumerName');
  // LevelDB stores keys as UTF-8, where a lone surrogate becomes U+FFFD: two names would share state.
  if (measureUtf8(consumerName).loneSurrogate) {
    outOfRange('consumerName', 'a string without lone UTF-16 surrogates', consumerName);
  }
  const { store } = options;
  const storeWhat = 'a folder path, an opened DedupStore or a PostgresStore';
  if (store === '') outOfRange('store', storeWhat, store);
  if (typeof store !== 'string' && !(store instanceof DedupStore) && !isConsumerStoreProvider(store)) {
    typeMismatch('store', storeWhat, store);
  }
  expectFunction(options.handler, 'handler');
  expectOptionalFunction(options.tenant, 'tenant');
  expectOptionalFunction(options.onEvent, 'onEvent');
  const hooks = options.hooks;
  expectOptionalObject(hooks, 'hooks');
  expectOptionalFunction(hooks?.beforeCommit, 'hooks.beforeCommit');
  expectOptionalFunction(hooks?.afterCommit, 'hooks.afterCommit');
  const result: ResolvedVerifyingConsumerOptions = Object.freeze({
    consumerName,
    store,
    sync: booleanOption(options.sync, 'sync', false),
    handler: options.handler,
    policy: resolvePolicy(options.policy),
    tenant: options.tenant,
    unidentified: choiceOption(options.unidentified, 'unidentified', ['reject', 'pass-through'], 'reject'),
    commit: choiceOption(options.commit, 'commit', ['message', 'batch'], 'batch'),
    commitEvery: integerOption(options.commitEvery, 'commitEvery', 1000, 1),
    commitLingerMs: timerOption(options.commitLingerMs, 'commitLingerMs', 5, 1),
    scopeTtlMs: integerOption(options.scopeTtlMs, 'scopeTtlMs', 0, 0),
    onEvent: options.onEvent ?? undefined,
    logger: resolveLogger(options.logger),
    hooks: hooks ?? undefined,
  });
  resolved.add(result);
  return result;
}

/**
 * Checks the subscription options every transport's verifying consumer takes and returns them
 * with their defaults, frozen.
 *
 * @throws TypeError when an option has the wrong type.
 * @throws RangeError when an option is out of range.
 */
export function resolveSubscriptionOptions(options: SubscriptionOptions): ResolvedSubscriptionOptions {
  const { reconnect } = options;
  expectOptionalObject(reconnect, 'reconnect');
  return Object.freeze({
    startFrom: choiceOption(options.startFrom, 'startFrom', ['first', 'next'], 'first'),
    reconnect: Object.freeze({
      initialDelayMs: timerOption(reconnect?.initialDelayMs, 'reconnect.initialDelayMs', 100, 1),
      maxDelayMs: timerOption(reconnect?.maxDelayMs, 'reconnect.maxDelayMs', 5_000, 1),
    }),
    connectTimeoutMs: timerOption(options.connectTimeoutMs, 'connectTimeoutMs', 10_000, 1),
  });
}

/**
 * A required non-empty string.
 *
 * @throws TypeError when `value` is not a string; RangeError when it is empty.
 */
export function nonEmptyString(value: unknown, name: string): string {
  if (typeof value !== 'string') typeMismatch(name, 'a non-empty string', value);
  if (value.length === 0) outOfRange(name, 'a non-empty string', value);
  return value;
}

function resolvePolicy(policy: unknown): PolicySpec {
  if (policy === undefined || policy === null) return DEFAULT_POLICY;
  expectObject(policy, 'policy');
  const kinds = ['highest', 'window'] as const;
  if (policy.kind === undefined) typeMismatch('policy.kind', `one of 'highest', 'window'`, undefined);
  const kind = choiceOption(policy.kind, 'policy.kind', kinds, 'window');
  if (kind === 'window') {
    const what = `an integer from 1 to ${MAX_WINDOW_SIZE}`;
    if (policy.size === undefined) typeMismatch('policy.size', what, undefined);
    integerOption(policy.size, 'policy.size', 0, 1, MAX_WINDOW_SIZE);
  }
  return checkPolicySpec(policy);
}
