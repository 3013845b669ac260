/**
 * The consumer group member's options, resolved in one place before any I/O: the verifying
 * consumer's options (consumer/options.ts), the subscription's and the connection's, and the
 * group's own; the strategy the store chooses (a folder path or a `DedupStore`: the changelog
 * strategy; a `PostgresStore`: the shared database), and the options of one strategy refused
 * with the other's store.
 */
import type { ConsumerStoreProvider } from '../consumer/consumer-store.js';
import { isConsumerStoreProvider } from '../consumer/consumer-store.js';
import { checkCommitLinger, checkPlainName } from '../consumer/core.js';
import {
  nonEmptyString,
  resolveSubscriptionOptions,
  resolveVerifyingConsumerOptions,
  type ResolvedSubscriptionOptions,
  type ResolvedVerifyingConsumerOptions,
} from '../consumer/options.js';
import { DedupError } from '../errors.js';
import { producerNameProblem } from '../identity/producer-name.js';
import { DedupStore } from '../store/store.js';
import { checkConnectionOptions } from '../transport/stream-consumer.js';
import { EndpointRotation, type StreamConnectionOptions } from '../transport/util.js';
import {
  expectFunction,
  expectOptionalFunction,
  expectOptionalObject,
  integerOption,
  outOfRange,
  typeMismatch,
} from '../util/options.js';
import { resolveRetention, type ChangelogRetention } from './changelog-retention.js';
import type { SnapshotPolicy } from './snapshot-writer.js';
import type { AssignmentEvent, GroupMessageHandler, SuperStreamVerifyingConsumerOptions } from './types.js';

/** The member's options with their defaults, checked. @internal */
export interface ResolvedGroupOptions {
  readonly superStream: string;
  readonly consumerName: string;
  readonly handler: GroupMessageHandler;
  /** The verifying consumer's options every partition's core is opened with. */
  readonly consumer: ResolvedVerifyingConsumerOptions;
  readonly hooks: SuperStreamVerifyingConsumerOptions['hooks'];
  readonly subscription: ResolvedSubscriptionOptions;
  readonly connection: StreamConnectionOptions;
  readonly onAssignment: ((event: AssignmentEvent) => void) | undefined;
  readonly stalledMs: number;
  /** How often the lag gauge is sampled (0: never). */
  readonly lagIntervalMs: number;
  /** The strategy the store chooses, with what only it uses. */
  readonly strategy:
    | {
        readonly kind: 'changelog';
        readonly store: string | DedupStore;
        readonly producer: string;
        readonly appendTimeoutMs: number;
        readonly appendsInFlight: number;
        readonly restoreTimeoutMs: number;
        readonly tenantVersion: string | undefined;
        /** When snapshots are written (§12.1); both 0: never. */
        readonly snapshots: SnapshotPolicy;
        /** The retention changelogs are created with (§12.2); `undefined`: none. */
        readonly retention: ChangelogRetention | undefined;
        /** Partitions not held that the member keeps a standby copy of (§12.3); 0: none. */
        readonly standbyReplicas: number;
      }
    | { readonly kind: 'shared-database'; readonly store: ConsumerStoreProvider };
}

/** Changelog entries between two snapshots by default (§12.1; measured in docs/design.md). */
const SNAPSHOT_EVERY_ENTRIES = 10_000;
/** Changelog entry bytes between two snapshots by default. */
const SNAPSHOT_EVERY_BYTES = 64 * 1024 * 1024;

/** The producer name every member of group `consumerName` writes changelogs under. */
export function changelogProducerName(consumerName: string): string {
  return `stream-dedup.changelog.${consumerName}`;
}

/**
 * Refuses a group name that could share a changelog with another group: one with a '.'. Partition
 * names come from the super stream and may hold dots (`<superStream>-<key>`, or any bound stream),
 * so only the group's name can be kept free of them; refusing keeps every existing changelog name
 * as it was (no renamed changelog left behind unread). A shared database names a partition's rows
 * `<consumerName>` U+001F `<partition>` (shared-db-strategy.ts).
 *
 * @throws DedupError `DEDUP_UNSAFE_OPTIONS` for a name with a '.'.
 */
export function checkGroupName(consumerName: string): void {
  if (!consumerName.includes('.')) return;
  throw new DedupError(
    'DEDUP_UNSAFE_OPTIONS',
    `consumerName ${JSON.stringify(consumerName)} holds a '.': a group's changelogs are named ` +
      '<partition>.<consumerName>.changelog, and with a dot two groups could share one (group "billing" ' +
      'on partition "orders-eu.west" and group "west.billing" on "orders-eu"); choose a name without one',
  );
}

/**
 * Checks `tenantVersion`: a non-empty string of at most 64 UTF-8 bytes, given only with `tenant`
 * (it names that function in the settings header every changelog record carries).
 */
function tenantVersionOption(value: unknown, hasTenant: boolean): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'string') typeMismatch('tenantVersion', 'a string', value);
  if (value === '' || Buffer.byteLength(value, 'utf8') > 64)
    outOfRange('tenantVersion', 'a non-empty string of at most 64 UTF-8 bytes', value);
  if (!hasTenant) throw new TypeError('Expected tenantVersion to be given only with tenant, got no tenant');
  return value;
}

/**
 * `appendsInFlight` by default: depth 4 measured +4 to +17 % over 1 (bench/group-depths.ts, docs/design.md
 * §12). A batch decided before a member was paused is not written or reported after it once the partition
 * moved: the hold lease (hold-lease.ts) proves the hold again first.
 */
const DEFAULT_APPENDS_IN_FLIGHT = 4;
/** Each batch in flight holds its writes in memory: at most this many per partition. */
const MAX_APPENDS_IN_FLIGHT = 32;

/** `standbyReplicas` at most: each copy is a tail every 250 ms (standby-tail.ts). */
const MAX_STANDBY_REPLICAS = 1_000;

/** Options only the changelog strategy uses: refused with a shared database's store. */
const CHANGELOG_ONLY = [
  'appendTimeoutMs',
  'appendsInFlight',
  'restoreTimeoutMs',
  'tenantVersion',
  'sync',
  'snapshotEveryEntries',
  'snapshotEveryBytes',
  'changelogRetention',
  'standbyReplicas',
] as const;

/**
 * Checks every option of a member (pure: opens nothing) and returns them with their defaults.
 *
 * @throws TypeError, RangeError for a bad option ("Expected <option> to be <what>, got <value>").
 * @throws DedupError `DEDUP_UNSAFE_OPTIONS` for `scopeTtlMs`, a `consumerName` with a '.', or an
 *   option of the changelog strategy given with a `PostgresStore` (its members keep no changelog).
 * @internal
 */
export function resolveGroupOptions(options: SuperStreamVerifyingConsumerOptions): ResolvedGroupOptions {
  const superStream = nonEmptyString(options?.superStream, 'superStream');
  expectFunction(options.handler, 'handler');
  const scopeTtlMs = (options as { scopeTtlMs?: unknown }).scopeTtlMs;
  if (scopeTtlMs !== undefined && scopeTtlMs !== 0) {
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      'scopeTtlMs is not supported by SuperStreamVerifyingConsumer: a scope forgotten by one member ' +
        'is not forgotten in the changelog, and the next holder of the partition would see it again',
    );
  }
  const consumer = resolveVerifyingConsumerOptions({
    ...options,
    scopeTtlMs: 0,
    handler: () => undefined,
    // The group's hooks are told the partition too: checked here, wrapped per partition.
    hooks: undefined,
  });
  const { hooks } = options;
  expectOptionalObject(hooks, 'hooks');
  expectOptionalFunction(hooks?.beforeCommit, 'hooks.beforeCommit');
  expectOptionalFunction(hooks?.afterCommit, 'hooks.afterCommit');
  const subscription = resolveSubscriptionOptions(options);
  const connection = checkConnectionOptions(options.connection);
  // Checks the TLS options too, before anything is opened.
  new EndpointRotation(connection);
  const consumerName = consumer.consumerName;
  checkGroupName(consumerName);
  expectOptionalFunction(options.onAssignment, 'onAssignment');
  // What both strategies resolve alike.
  const common = {
    superStream,
    consumerName,
    handler: options.handler,
    consumer,
    hooks,
    subscription,
    connection,
    onAssignment: options.onAssignment,
    lagIntervalMs: integerOption(options.lagIntervalMs, 'lagIntervalMs', 30_000, 0, 2_147_483_647),
  };
  const { store } = consumer;
  const shared = isConsumerStoreProvider(store);
  const stalledMs = integerOption(options.stalledPartitionMs, 'stalledPartitionMs', shared ? 0 : 60_000, 0);
  if (stalledMs !== 0 && stalledMs <= consumer.commitLingerMs) {
    // A quiet partition's batch waits commitLingerMs for its commit: the watch would take every
    // trickle of input for a stuck group.
    throw new RangeError(
      `Expected stalledPartitionMs to be 0 or more than commitLingerMs (${consumer.commitLingerMs}), got ${stalledMs}`,
    );
  }
  if (shared) {
    // The plain consumer's refusal, made here before the broker is reached (the core makes it
    // again only when a partition is activated).
    checkCommitLinger(consumer.commitLingerMs, store);
    checkPlainName(consumerName);
    // Each of these would be ignored: a member that believes it bounds its appends, or names its
    // tenant function to the others, must be told it does not.
    const given = CHANGELOG_ONLY.filter((name) => options[name] !== undefined);
    if (stalledMs !== 0) given.push('stalledPartitionMs' as never);
    if (given.length > 0) {
      throw new DedupError(
        'DEDUP_UNSAFE_OPTIONS',
        `${given.join(', ')} ${given.length === 1 ? 'is an option' : 'are options'} of the changelog strategy: ` +
          'with a PostgresStore the members share the database and keep no changelog (the ' +
          'stalled-partition watch, which reads the changelog, is off); remove ' +
          (given.length === 1 ? 'it' : 'them'),
      );
    }
    return Object.freeze({
      ...common,
      stalledMs: 0,
      strategy: Object.freeze({ kind: 'shared-database' as const, store }),
    });
  }
  if (typeof store !== 'string' && !(store instanceof DedupStore)) {
    typeMismatch('store', 'a folder path, an opened DedupStore or a PostgresStore', store);
  }
  const appendTimeoutMs = integerOption(options.appendTimeoutMs, 'appendTimeoutMs', 30_000, 1);
  const appendsInFlight = integerOption(
    options.appendsInFlight,
    'appendsInFlight',
    DEFAULT_APPENDS_IN_FLIGHT,
    1,
    MAX_APPENDS_IN_FLIGHT,
  );
  const restoreTimeoutMs = integerOption(options.restoreTimeoutMs, 'restoreTimeoutMs', 300_000, 1);
  const snapshots: SnapshotPolicy = Object.freeze({
    everyEntries: integerOption(
      options.snapshotEveryEntries,
      'snapshotEveryEntries',
      SNAPSHOT_EVERY_ENTRIES,
      0,
    ),
    everyBytes: integerOption(options.snapshotEveryBytes, 'snapshotEveryBytes', SNAPSHOT_EVERY_BYTES, 0),
  });
  const retention = resolveRetention(options.changelogRetention, snapshots);
  const standbyReplicas = integerOption(
    options.standbyReplicas,
    'standbyReplicas',
    0,
    0,
    MAX_STANDBY_REPLICAS,
  );
  const tenantVersion = tenantVersionOption(options.tenantVersion, consumer.tenant !== undefined);
  const producer = changelogProducerName(consumerName);
  const prefixBytes = Buffer.byteLength(changelogProducerName(''), 'utf8');
  if (Buffer.byteLength(producer, 'utf8') > 256) {
    throw new RangeError(
      `Expected consumerName to be at most ${256 - prefixBytes} UTF-8 bytes, got ${Buffer.byteLength(consumerName, 'utf8')}`,
    );
  }
  // The changelog's readers accept only records whose producer name readIdentity takes: a group
  // name it would call malformed (a control character, U+FFFD) wrote changelogs that every
  // take-over then refused.
  const problem = producerNameProblem(producer);
  if (problem !== undefined) {
    throw new TypeError(
      `Expected consumerName to be a valid producer name, but its changelog producer name ${problem}`,
    );
  }
  return Object.freeze({
    ...common,
    stalledMs,
    strategy: Object.freeze({
      kind: 'changelog' as const,
      store,
      producer,
      appendTimeoutMs,
      appendsInFlight,
      restoreTimeoutMs,
      tenantVersion,
      snapshots,
      retention,
      standbyReplicas,
    }),
  });
}
