/**
 * `stream-dedup delete NAME [--group G]… [--yes]`: deletes a super stream (its exchange and
 * partitions) with the changelogs (`<partition>.<group>.changelog`) of the named groups, or a
 * stream. It says what it will delete and asks on a terminal; without a terminal it deletes only
 * with `--yes`. The broker cannot list a super stream's groups (no protocol enumerates streams):
 * changelogs of groups not named are left, and `list NAME --group G` shows what is there.
 */
import { DedupError } from '../errors.js';
import { changelogStreamName } from '../group/consumer.js';
import type { StreamConnectionOptions } from '../transport/util.js';
import { ask, DOES_NOT_EXIST, queryPartitions, responseCode, withStreamClient } from './broker-client.js';
import { plural } from './output.js';

/** What `delete` found to delete. */
export interface DeletionPlan {
  readonly name: string;
  /** A super stream (its partitions are deleted with it), or a stream. */
  readonly kind: 'super-stream' | 'stream';
  readonly partitions: readonly string[];
  /** The named groups' changelogs that exist. */
  readonly changelogs: readonly string[];
}

/** The plan in one sentence, for the question and the last line. */
export function describeDeletion(plan: DeletionPlan): string {
  if (plan.kind === 'stream') return `stream "${plan.name}"`;
  return (
    `super stream "${plan.name}" with ${plural(plan.partitions.length, 'partition')} (${plan.partitions.join(', ')})` +
    (plan.changelogs.length === 0
      ? ''
      : ` and ${plural(plan.changelogs.length, 'changelog')} (${plan.changelogs.join(', ')})`)
  );
}

/**
 * Finds what to delete, asks `confirm` (false: nothing is deleted), then deletes the changelogs
 * first and the super stream (or stream) last, so that a failure half-way leaves the super stream
 * to run `delete` on again. Returns the plan, and whether it was deleted.
 *
 * @throws DedupError `DEDUP_BROKER_REFUSED` (nothing of that name, or a refused delete),
 *   `DEDUP_BROKER_UNREACHABLE`.
 */
export function deleteByName(
  connection: StreamConnectionOptions,
  name: string,
  groups: readonly string[],
  confirm: (plan: DeletionPlan) => Promise<boolean>,
): Promise<{ readonly plan: DeletionPlan; readonly deleted: boolean }> {
  return withStreamClient(connection, async (client) => {
    const partitions = await queryPartitions(client, name);
    let plan: DeletionPlan;
    if (partitions.length > 0) {
      const changelogs: string[] = [];
      for (const partition of partitions) {
        for (const group of groups) {
          const changelog = changelogStreamName(partition, group);
          const [m] = await ask(client, `querying the metadata of "${changelog}"`, (c) =>
            c.queryMetadata({ streams: [changelog] }),
          );
          if (m !== undefined && m.responseCode !== DOES_NOT_EXIST) changelogs.push(changelog);
        }
      }
      plan = { name, kind: 'super-stream', partitions, changelogs };
    } else {
      const [m] = await ask(client, `querying the metadata of "${name}"`, (c) =>
        c.queryMetadata({ streams: [name] }),
      );
      if (m === undefined || m.responseCode === DOES_NOT_EXIST) {
        throw new DedupError('DEDUP_BROKER_REFUSED', `no stream or super stream is named "${name}"`);
      }
      plan = { name, kind: 'stream', partitions: [], changelogs: [] };
    }
    if (!(await confirm(plan))) return { plan, deleted: false };
    for (const changelog of plan.changelogs) {
      await ask(client, `deleting changelog "${changelog}"`, (c) =>
        c.deleteStream({ stream: changelog }).catch((err: unknown) => {
          if (responseCode(err) !== DOES_NOT_EXIST) throw err;
          return true as const;
        }),
      );
    }
    if (plan.kind === 'super-stream') {
      await ask(client, `deleting super stream "${name}"`, (c) => c.deleteSuperStream({ streamName: name }));
    } else {
      await ask(client, `deleting stream "${name}"`, (c) => c.deleteStream({ stream: name }));
    }
    return { plan, deleted: true };
  });
}
