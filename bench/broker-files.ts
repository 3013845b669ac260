/**
 * Where the broker keeps a stream's files, for the benchmarks' bytes-on-disk rows (bench:publish,
 * the changelog with retention in bench:verify).
 *
 * The folder of every stream is, by default, the one scripts/rabbitmq.sh's live single node uses:
 * `$STREAM_DEDUP_CACHE/<suite>/var/lib/stream-dedup/<node>/mnesia/<node>@localhost/stream` (the
 * chroot of RABBITMQ_LINE's Debian suite, forky for 4.3, trixie for 4.0; the node's
 * RABBITMQ_MNESIA_BASE; osiris's data_dir under it). "Live" is checked: the node's pid file
 * (RABBITMQ_PID_FILE, `<node>/pid`) names a running process. Without RABBITMQ_LINE both lines are
 * looked at and the one whose node runs is taken (a stopped line's folder holds only leftovers:
 * reading it gave "undefined" bytes for a whole session). STREAM_DEDUP_BROKER_STREAMS names the
 * folder instead (a broker this script did not start), or `off` to leave the disk rows out.
 * Anything else that cannot be found throws, naming what was looked at.
 */
import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';

/** scripts/rabbitmq.sh's lines and their Debian suites (`line_suite`). */
const SUITES: Readonly<Record<string, string>> = { '4.3': 'forky', '4.0': 'trixie' };

/** Why the broker's stream folder could not be found (the message says what to set). */
export class BrokerFilesError extends Error {
  override readonly name = 'BrokerFilesError';
}

/** True when process `pid` exists (EPERM: it exists, owned by another user). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * The live broker's stream folder, or `undefined` when STREAM_DEDUP_BROKER_STREAMS is `off`.
 * `env` is process.env unless a test passes its own.
 */
export async function brokerStreamsDir(
  env: Readonly<Record<string, string | undefined>> = process.env,
): Promise<string | undefined> {
  const given = env.STREAM_DEDUP_BROKER_STREAMS;
  if (given === 'off') return undefined;
  if (given !== undefined && given !== '') {
    const s = await stat(given).catch(() => undefined);
    if (s?.isDirectory() !== true)
      throw new BrokerFilesError(`STREAM_DEDUP_BROKER_STREAMS=${given} is not a readable folder`);
    return given;
  }
  const cache = env.STREAM_DEDUP_CACHE ?? '/var/cache/stream-dedup';
  const node = env.STREAM_DEDUP_NODE ?? 'rabbit';
  const lines = env.RABBITMQ_LINE === undefined ? Object.keys(SUITES) : [env.RABBITMQ_LINE];
  const looked: string[] = [];
  for (const line of lines) {
    const suite = SUITES[line];
    if (suite === undefined) throw new BrokerFilesError(`RABBITMQ_LINE=${line}: known lines are 4.3, 4.0`);
    const nodeDir = path.join(cache, suite, 'var/lib/stream-dedup', node);
    const pidFile = path.join(nodeDir, 'pid');
    const pid = Number((await readFile(pidFile, 'utf8').catch(() => '')).trim());
    if (!Number.isSafeInteger(pid) || pid <= 0 || !alive(pid)) {
      looked.push(`${pidFile}: no running node`);
      continue;
    }
    const dir = path.join(nodeDir, 'mnesia', `${node}@localhost`, 'stream');
    if ((await stat(dir).catch(() => undefined))?.isDirectory() !== true) {
      looked.push(`${dir}: node ${pid} runs but this folder is missing`);
      continue;
    }
    return dir;
  }
  throw new BrokerFilesError(
    `the live broker's stream folder was not found (${looked.join('; ')}): set STREAM_DEDUP_BROKER_STREAMS to the folder holding its streams (osiris data_dir), or to off to leave the bytes-on-disk rows out`,
  );
}

/** The characters osiris_util:to_base64uri keeps (?BASE64_URI_CHARS); every other one becomes `_`. */
const KEPT = /^[A-Za-z0-9_=-]$/;

/**
 * What the broker makes of `text` in a stream's folder name (rabbit_stream_queue's stream_name:
 * `osiris_util:to_base64uri(binary_to_list(<<VHost, "_", Name, "_", Timestamp>>))`): the UTF-8
 * bytes as characters, one `_` for each grapheme that is not a base64url character (`=` kept). In
 * 0..255 only CR LF is one grapheme of two characters.
 */
export function brokerFolderText(text: string): string {
  const bytes = Buffer.from(text, 'utf8');
  let out = '';
  for (let i = 0; i < bytes.length; i++) {
    const ch = String.fromCharCode(bytes[i]!);
    if (KEPT.test(ch)) out += ch;
    else {
      out += '_';
      if (bytes[i] === 0x0d && bytes[i + 1] === 0x0a) i++;
    }
  }
  return out;
}

/**
 * True when `folder` is the broker's folder of `stream` in `vhost`: `<vhost>_<stream>_<timestamp>`,
 * each mapped by brokerFolderText, the timestamp digits. Different names may map alike (`a.b` and
 * `a_b`): the caller refuses more than one match.
 */
export function isStreamFolder(folder: string, stream: string, vhost = '/'): boolean {
  const prefix = `${brokerFolderText(vhost)}_${brokerFolderText(stream)}_`;
  return folder.startsWith(prefix) && /^[0-9]+$/.test(folder.slice(prefix.length));
}

/** A stream's files on the broker's disk: apparent bytes and allocated bytes (st_blocks × 512). */
export interface StreamDisk {
  readonly folder: string;
  readonly bytes: number;
  readonly allocatedBytes: number;
  readonly files: number;
}

/**
 * The size of `stream`'s segment and index files in `dir` (brokerStreamsDir). Throws unless exactly
 * one folder is the stream's.
 */
export async function streamDisk(dir: string, stream: string, vhost = '/'): Promise<StreamDisk> {
  const folders = (await readdir(dir)).filter((f) => isStreamFolder(f, stream, vhost));
  if (folders.length !== 1)
    throw new BrokerFilesError(
      `${folders.length} folders of stream ${JSON.stringify(stream)} in ${dir} (${folders.join(', ') || 'none'}): is this the broker the bench publishes to? (STREAM_DEDUP_BROKER_STREAMS)`,
    );
  const folder = path.join(dir, folders[0]!);
  let bytes = 0;
  let allocatedBytes = 0;
  const names = await readdir(folder);
  for (const name of names) {
    const s = await stat(path.join(folder, name));
    bytes += s.size;
    allocatedBytes += s.blocks * 512;
  }
  return { folder, bytes, allocatedBytes, files: names.length };
}
