/**
 * `stream-dedup list NAME… [--group G]… [--producer P]… [--json]`: what the broker holds under
 * the given names — a super stream's partitions, each stream's leader, replicas and offsets, the
 * changelogs (`<partition>.<group>.changelog`) of the named groups, and the last publishing ID the
 * broker keeps for each named producer.
 *
 * Neither the stream protocol nor AMQP 0-9-1 can enumerate a broker's streams (only the HTTP
 * management plugin can, and it is not assumed): `list` sees exactly the names it is given, the
 * partitions the broker's partitions query returns for them, and the changelogs of the groups it
 * is told. Sizes are offsets (the protocol's stream statistics), not bytes.
 */
import type { Client } from 'rabbitmq-stream-js-client';
import { changelogStreamName } from '../group/consumer.js';
import { queryPublisherSequence } from '../transport/stream-client-internals.js';
import { errorText, type StreamConnectionOptions } from '../transport/util.js';
import { ask, DOES_NOT_EXIST, queryPartitions, withStreamClient } from './broker-client.js';
import { formatTable, printable, toJson } from './output.js';

/** One stream `list` found. */
export interface ListedStream {
  readonly stream: string;
  /** `stream`, `partition` (of {@link ListedStream.superStream}) or `changelog` (of {@link ListedStream.group}). */
  readonly kind: 'stream' | 'partition' | 'changelog';
  readonly superStream: string | null;
  readonly group: string | null;
  /** `host:port` of the leader, as the metadata query answers. */
  readonly leader: string | null;
  readonly replicas: number;
  /** The first offset still in the stream (retention removes older ones); null when empty. */
  readonly firstOffset: bigint | null;
  /** The first offset of the last committed chunk: the stream holds messages up to at least it; null when empty. */
  readonly lastChunkOffset: bigint | null;
  /** The broker's last publishing ID of each named producer that published here. */
  readonly producers: ReadonlyArray<{ readonly producerName: string; readonly lastId: bigint }>;
}

/** What `list` found. */
export interface ListReport {
  readonly superStreams: ReadonlyArray<{
    readonly superStream: string;
    readonly partitions: readonly string[];
  }>;
  readonly streams: readonly ListedStream[];
  /** Names given that are neither a stream nor a super stream. */
  readonly missing: readonly string[];
}

/** The arguments of `list`, or what is wrong with them. */
export interface ListArgs {
  readonly names: readonly string[];
  readonly groups: readonly string[];
  readonly producers: readonly string[];
}

/** Checks `list`'s arguments before any I/O: at least one name; a group name holds no '.'. */
export function checkListArgs(args: ListArgs): ListArgs | string {
  if (args.names.length === 0) {
    return (
      'expects one or more stream or super stream names: the stream protocol and AMQP 0-9-1 cannot ' +
      "enumerate a broker's streams (only the HTTP management plugin can)"
    );
  }
  const empty = [...args.names, ...args.groups, ...args.producers].find((n) => n.length === 0);
  if (empty !== undefined) return 'names must not be empty';
  const dotted = args.groups.find((g) => g.includes('.'));
  if (dotted !== undefined) return `--group ${JSON.stringify(dotted)}: a group name holds no '.'`;
  return args;
}

/**
 * Queries the broker for `args`' names. Streams in the order found: each name's partitions (or
 * the stream), each followed by its groups' changelogs that exist.
 *
 * @throws DedupError `DEDUP_BROKER_UNREACHABLE` or `DEDUP_BROKER_REFUSED` (a query refused for
 *   another reason than "does not exist").
 */
export function listStreams(connection: StreamConnectionOptions, args: ListArgs): Promise<ListReport> {
  return withStreamClient(connection, async (client) => {
    const superStreams: Array<{ superStream: string; partitions: string[] }> = [];
    const streams: ListedStream[] = [];
    const missing: string[] = [];
    for (const name of args.names) {
      const partitions = await queryPartitions(client, name);
      if (partitions.length > 0) superStreams.push({ superStream: name, partitions });
      const plain = await describeStream(client, name, args.producers, { kind: 'stream' });
      if (plain !== undefined) streams.push(plain);
      if (partitions.length === 0 && plain === undefined) missing.push(name);
      for (const partition of partitions) {
        const p = await describeStream(client, partition, args.producers, {
          kind: 'partition',
          superStream: name,
        });
        if (p !== undefined) streams.push(p);
        for (const group of args.groups) {
          const c = await describeStream(client, changelogStreamName(partition, group), [], {
            kind: 'changelog',
            superStream: name,
            group,
          });
          if (c !== undefined) streams.push(c);
        }
      }
    }
    return { superStreams, streams, missing };
  });
}

/** One stream's metadata, offsets and producers; `undefined` when it does not exist. */
async function describeStream(
  client: Client,
  stream: string,
  producers: readonly string[],
  what: { kind: ListedStream['kind']; superStream?: string; group?: string },
): Promise<ListedStream | undefined> {
  const [metadata] = await ask(client, `querying the metadata of "${stream}"`, (c) =>
    c.queryMetadata({ streams: [stream] }),
  );
  if (metadata === undefined || metadata.responseCode === DOES_NOT_EXIST) return undefined;
  let stats: { firstChunkId: bigint; committedChunkId: bigint } | undefined;
  try {
    stats = await ask(client, `querying the statistics of "${stream}"`, (c) => c.streamStatsRequest(stream));
  } catch (err) {
    // A stream without a committed chunk answers "no offset": it is empty.
    if (!/offset/i.test(errorText(err))) throw err;
  }
  const empty = stats === undefined || stats.committedChunkId < 0n;
  const lastIds: Array<{ producerName: string; lastId: bigint }> = [];
  for (const producerName of producers) {
    const lastId = await ask(client, `querying producer "${producerName}" on "${stream}"`, (c) =>
      queryPublisherSequence(c, stream, producerName),
    );
    if (lastId > 0n) lastIds.push({ producerName, lastId });
  }
  const leader = metadata.leader;
  return {
    stream,
    kind: what.kind,
    superStream: what.superStream ?? null,
    group: what.group ?? null,
    leader: leader === undefined ? null : `${leader.host}:${leader.port}`,
    replicas: metadata.replicas?.length ?? 0,
    firstOffset: empty ? null : stats!.firstChunkId,
    lastChunkOffset: empty ? null : stats!.committedChunkId,
    producers: lastIds,
  };
}

/** The `--json` output. */
export function formatListJson(report: ListReport): string {
  return toJson(report);
}

/** The text output: the super streams, a table of streams, the names not found. */
export function formatList(report: ListReport): string {
  const lines: string[] = [];
  for (const s of report.superStreams) {
    lines.push(`super stream ${JSON.stringify(s.superStream)}: partitions ${s.partitions.join(', ')}`);
  }
  if (report.streams.length > 0) {
    if (lines.length > 0) lines.push('');
    lines.push(
      formatTable(
        ['stream', 'kind', 'leader', 'replicas', 'first offset', 'last chunk at', 'producers (last id)'],
        report.streams.map((s) => [
          printable(s.stream),
          s.kind === 'stream' ? 'stream' : s.kind === 'partition' ? 'partition' : `changelog of ${s.group}`,
          s.leader ?? '-',
          String(s.replicas),
          s.firstOffset === null ? 'empty' : String(s.firstOffset),
          s.lastChunkOffset === null ? '-' : String(s.lastChunkOffset),
          s.producers.map((p) => `${printable(p.producerName)} (${p.lastId})`).join(', ') || '-',
        ]),
        ['left', 'left', 'left', 'right', 'right', 'right', 'left'],
      ),
    );
  }
  for (const name of report.missing) {
    lines.push(`${JSON.stringify(name)}: no stream or super stream of that name`);
  }
  return lines.join('\n');
}
