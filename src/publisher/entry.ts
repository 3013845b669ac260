/**
 * What the publisher core keeps per message and per key between `send()` and the confirm: the
 * entry itself, its rare extras, the in-memory key records and the store segments they belong to.
 */
import type { Headers } from '../store/codec.js';
import type { OutgoingMessage, SendResult } from './types.js';

/**
 * A message between `send()` and its confirm. A class with every field set in the constructor:
 * one shape for every entry, and nothing allocated beside it on the common path (an entry lives
 * until its confirm, so its size is what each young-generation collection copies).
 */
export class Entry implements OutgoingMessage {
  /** Settles the caller's promise; absent for messages recovered from the outbox. */
  resolve: ((result: SendResult) => void) | undefined = undefined;
  reject: ((error: Error) => void) | undefined = undefined;
  /** The outbox segment holding it (outbox durability). */
  segment: Segment | undefined = undefined;
  /** Its sub-entry batch (every member, in ID order), fixed at its group commit; none when alone. */
  batch: readonly Entry[] | undefined = undefined;
  /** When it was last handed to the transport (whole ms, monotonic); 0 when not yet sent on this connection. */
  sentAt = 0;
  /**
   * Keyed sends: the seq of the key's record in the key table (no lookup when the message
   * settles), or -1 for none.
   */
  keySeq = -1;
  /** Keyed sends: when the key was accepted (ms since the epoch), its record's age. */
  keyCreatedAtMs = 0;
  /** Rare parts: an abort signal, repeats of the key waiting for this message. */
  extra: EntryExtra | undefined = undefined;

  constructor(
    /** Mutable only while the entry waits for room, unwritten and unsent (renumbered after an abort). */
    public publishingId: bigint,
    /** Released (emptied) once it is aborted while parked: see {@link Entry.release}. */
    public body: Uint8Array,
    public headers: Headers | undefined,
    /** Keyed sends: the domain key. */
    readonly key: string | undefined,
  ) {}

  /** Settles the caller's promise (at most once) and stops listening to its abort signal. */
  settle(outcome: Error | SendResult): void {
    const { resolve, reject } = this;
    this.resolve = undefined;
    this.reject = undefined;
    const extra = this.extra;
    if (extra?.abortGroup !== undefined) {
      extra.abortGroup.leave(this);
      extra.abortGroup = undefined;
    }
    if (outcome instanceof Error) reject?.(outcome);
    else resolve?.(outcome);
  }

  /**
   * Lets go of the body and headers of a send aborted while parked: it will never be written or
   * sent, but it stays in the send queue until the queue's head or a compaction reaches it, and k
   * large aborted sends among live parked ones would stay reachable for as long as confirms are
   * withheld (REVIEW §6). Nothing reads them after the abort: a skip declaration it carried moves
   * from the declaration's own record, and the queue only reads its `extra`.
   */
  release(): void {
    this.body = RELEASED_BODY;
    this.headers = undefined;
  }

  /**
   * A promise for this entry's result, with its settlers stored in the entry. One shared executor
   * takes them: `new Promise((resolve, reject) => ...)` would allocate a closure and its context
   * for every send.
   */
  promise(): Promise<SendResult> {
    const promise = new Promise<SendResult>(captureSettlers);
    this.resolve = capturedResolve;
    this.reject = capturedReject;
    return promise;
  }
}

/** The body of every released entry. */
const RELEASED_BODY = new Uint8Array(0);

// Written by `captureSettlers` and read right after `new Promise` (the executor runs synchronously).
let capturedResolve: ((result: SendResult) => void) | undefined;
let capturedReject: ((error: Error) => void) | undefined;
function captureSettlers(resolve: (result: SendResult) => void, reject: (error: Error) => void): void {
  capturedResolve = resolve;
  capturedReject = reject;
}

/** What only some entries need. */
export interface EntryExtra {
  /** The sends sharing its abort signal (one listener for them all), while it waits. */
  abortGroup?: { leave(entry: Entry): void } | undefined;
  /** Repeats of the key that arrived while this message was in flight: settled with it. */
  keyWaiters?: KeyWaiter[] | undefined;
  /**
   * The uncommitted send of the same key this one took over (it was past the retention then): it
   * holds the key again if this one is aborted unwritten, since the abort lowers the last ID and
   * can bring it back inside the retention.
   */
  keyPrev?: Entry | undefined;
  /** The last ID handed out before this one: restored when this one, the last, is aborted unsent. */
  prevAssigned?: bigint | undefined;
  /** It waits for room under `maxInFlight` (set for entries with a signal: only they abort). */
  parked?: boolean | undefined;
  /** Aborted while parked: the send queue skips it at its head or takes it out when it compacts. */
  dropped?: boolean | undefined;
}

/** A key segment in the store: one group commit's keys, dropped whole when past the retention. */
export interface KeySegment {
  readonly firstId: bigint;
  readonly lastId: bigint;
  readonly newestMs: number;
  /** The key table's seq after its last record: dropping it drops every record below. */
  readonly end: number;
}

/** A repeat of a key that waits for the first send of the key. */
export interface KeyWaiter {
  resolve(publishingId: bigint): void;
  reject(error: Error): void;
}

/** One group commit's record, deleted once every message in it is confirmed. */
export interface Segment {
  readonly firstId: bigint;
  remaining: number;
}
