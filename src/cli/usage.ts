/** The CLI's help text, and how its errors are reported and mapped to exit codes. */
import { DedupError } from '../errors.js';
import { CliError } from './output.js';

export const USAGE = `stream-dedup — producer-side deduplication for RabbitMQ Streams

Usage:
  stream-dedup audit <stream> [--json] [--from OFFSET | --since TIME]
                                                read the stream from its first message and report per
                                                producer name: messages, duplicates (an id seen again),
                                                gaps (missing id ranges), out-of-order ids, first/last id;
                                                and the messages without identity. Copies marked by an
                                                AMQP 0-9-1 publisher (its outbox re-sends after a crash:
                                                the broker does not deduplicate AMQP 0-9-1) are counted
                                                apart as expected copies and do not fail it.
                                                --from reads from an offset, --since from the first chunk
                                                at or after an ISO time; a range cannot see earlier ids,
                                                so a copy of an earlier message is not a duplicate there
  stream-dedup audit <super-stream> [--json]    the same for each partition of a super stream (recognised
                                                by the broker's partitions query), then the sums; a name
                                                that is both needs --stream or --super-stream; --since
                                                applies to each partition (--from does not: offsets are
                                                per partition)
  stream-dedup inspect <store-folder> [--json] [--producer NAME]
                                                list a LevelDB store: producers (ids, outbox), super
                                                stream producers (the same per partition), verifying
                                                consumers (committed offsets) and verifier scopes, or only
                                                what concerns producer NAME; needs the store's lock, so
                                                stop the processes using it first
  stream-dedup inspect <postgres://URL> --schema S [--json] [--producer NAME]
                                                the same for a PostgreSQL store (stream-dedup/postgres):
                                                its schema version, consumers and scopes, read in one
                                                read-only transaction while consumers run
  stream-dedup demo [--kills N] [--per-run N] [--keep]
                                                publish (--per-run ≥ 100 messages a run), get SIGKILLed
                                                mid-way --kills times, restart, recover, then audit the
                                                stream: 0 lost, 0 duplicated; the stream is deleted at
                                                the end unless --keep
  stream-dedup create-super-stream <name> --partitions N | --keys k1,k2,…
                                                create a super stream: partitions <name>-0 … <name>-(N-1)
                                                (N from 1 to 1000), or <name>-k1, <name>-k2, … bound with
                                                the keys k1, k2, …; one that exists is refused
  stream-dedup list <name>… [--group G]… [--producer P]… [--json]
                                                what the broker holds under the names: a super stream's
                                                partitions; each stream's leader, replicas, first offset
                                                and last chunk's offset (sizes in offsets, not bytes);
                                                the groups' changelogs <partition>.<G>.changelog; the
                                                broker's last id of each producer P. Only given names are
                                                seen: no protocol here can enumerate a broker's streams
  stream-dedup delete <name> [--group G]… [--yes]
                                                delete a super stream (its partitions) with the groups'
                                                changelogs, or a stream; asks on a terminal, and without
                                                one deletes only with --yes
  stream-dedup migrate <schema> [--url URL] [--json]
                                                create the PostgreSQL store's tables (stream-dedup/postgres)
                                                in <schema>, or check that they are of this version;
                                                the URL defaults to STREAM_DEDUP_PG_URL, then DATABASE_URL
  stream-dedup outbox status --schema S [--postgres URL] [--producer NAME] [--json]
                                                the PostgreSQL transactional outbox of schema S, per producer
                                                name: rows waiting, the oldest one's age, the relay holding
                                                the lock, the last published (confirmed) ID per target; the
                                                URL defaults as migrate's; exit 4 when the server refuses
  stream-dedup help | --help                    this text
  stream-dedup --version                        the version of stream-dedup

--json prints one JSON object on stdout (64-bit integers as decimal strings). Progress lines go to
stderr, and only when it is a terminal.
Environment (defaults in parentheses):
  RABBITMQ_HOST (127.0.0.1)        the broker's host
  RABBITMQ_STREAM_PORT (5552)      its stream protocol port
  RABBITMQ_STREAM_ENDPOINTS        a cluster's stream endpoints, host:port,host:port, used instead of
                                   RABBITMQ_HOST and RABBITMQ_STREAM_PORT (each reconnect takes the next)
  RABBITMQ_AMQP_PORT (5672)        its AMQP 0-9-1 port (producers using the AMQP transport)
  RABBITMQ_USER (guest)            the user name
  RABBITMQ_PASSWORD (guest)        the password
  RABBITMQ_VHOST (/)               the virtual host
  RABBITMQ_TLS                     1: connect with TLS (default ports then 5551 and 5671); set by any of:
  RABBITMQ_TLS_CA_FILE             a PEM file of the CA(s) to verify the broker with (else the system's)
  RABBITMQ_TLS_CERT_FILE           a PEM client certificate, and RABBITMQ_TLS_KEY_FILE its key
  RABBITMQ_TLS_KEY_PASSPHRASE      the key's passphrase (never printed)
  RABBITMQ_TLS_SERVERNAME          the name to verify in the broker's certificate (default: the host)
  STREAM_DEDUP_DEBUG               1: print the stack of an error, not only its one-line message
Exit codes: 0 ok; 1 the audit found a problem: duplicates, gaps, ids out of order or a contradicted
skip (each alone is enough, in any partition of a super stream; declared skips, expected AMQP 0-9-1
copies and messages without identity are reported but do not fail it), or delete was answered no;
2 usage (delete without --yes and without a terminal included); 3 broker unreachable or refused (for
example no stream or super stream has the name, for list any of the names, or create-super-stream's
name exists); 4 store locked, corrupt or missing, or it has no producer of the --producer name, or
the PostgreSQL server refused (migrate, inspect, outbox status).`;

/** Prints the help; exit code 0. */
export function help(): number {
  console.log(USAGE);
  return 0;
}

/** One line on stderr, not a stack trace, for the errors users meet; returns the exit code. */
export function reportError(err: unknown): number {
  if (err instanceof CliError) {
    console.error(`error: ${err.message}`);
    return err.exitCode;
  }
  if (!(err instanceof DedupError)) throw err;
  console.error(`error: ${err.code}: ${err.message.replace(/\s*\n\s*/g, ' ')}`);
  return exitCodeOf(err);
}

/** The exit code of a failure (see the help's "Exit codes"). */
export function exitCodeOf(err: unknown): number {
  if (!(err instanceof DedupError)) return 1;
  if (err.code === 'DEDUP_BROKER_UNREACHABLE' || err.code === 'DEDUP_BROKER_REFUSED') return 3;
  if (err.code === 'DEDUP_STORE_LOCKED' || err.code === 'DEDUP_STORE_CORRUPT') return 4;
  if (err.code === 'DEDUP_STORE_REFUSED') return 4;
  return 1;
}
