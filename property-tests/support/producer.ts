import { DedupError, type DedupErrorCode } from '../../src/errors.js';
import { DedupPublisherCore } from '../../src/publisher/core.js';
import type { DedupPublisherOptions, Durability } from '../../src/publisher/types.js';
import { DedupStore } from '../../src/store/store.js';
import { memoryDisk } from '../../test/support/memory-store.js';
import { ProcessDisk, type ProcessDiskOptions } from './disk.js';
import type { ConnectionHooks, SimNetwork, SimTransport } from './network.js';
import { within } from './turns.js';

/** One logical producer: a name on a stream, and how it publishes. */
export interface ProducerSpec {
  readonly stream: string;
  readonly producerName: string;
  readonly durability: Durability;
  readonly idMode: 'auto' | 'explicit';
  readonly maxBatch?: number;
  readonly maxInFlight?: number;
  /** @defaultValue 0 (close rejects what is unconfirmed at once) */
  readonly closeTimeoutMs?: number;
  readonly onBrokerAhead?: 'error' | 'adopt';
}

/** One process life of a producer. */
export interface ProducerLife {
  readonly index: number;
  readonly disk: ProcessDisk;
  readonly transport: SimTransport;
  readonly core: DedupPublisherCore;
  /** Sends of this life whose promise has not settled. */
  unsettled: number;
  /** Set by a crash: nothing this life's core does afterwards is seen by anyone. */
  crashed: boolean;
  /** Set once `close()` was called in this life. */
  closing: boolean;
  /** Resolves when this life's `close()` has. */
  closed?: Promise<void>;
  /** Sends still unsettled when `close()` resolved (-1 before). */
  unsettledAtClose: number;
  /** No `send()` yet in this life (an application replays its source first). */
  fresh: boolean;
}

/**
 * A crashable producer process over a memory-level "disk" that outlives it. Each life opens a
 * {@link DedupPublisherCore} over a fresh {@link ProcessDisk} and {@link SimTransport}; a crash
 * abandons the core without closing it (its disk and transport go dead, so it can neither write
 * nor hear confirms). Records the history the checker needs: every label attempted, every label
 * whose `send()` resolved (with the ID it resolved with), and every unexpected rejection.
 */
export class ProducerHarness {
  readonly spec: ProducerSpec;
  readonly disk = memoryDisk();
  life: ProducerLife | undefined;
  lives = 0;
  /** Every life, in order. */
  readonly history: ProducerLife[] = [];
  readonly attempted = new Set<string>();
  /** Label → the publishing ID its `send()` resolved with. */
  readonly acknowledged = new Map<string, bigint>();
  /**
   * Explicit-mode labels replayed after a crash and refused with `DEDUP_ID_REGRESSION`: they must
   * end up in the stream. In outbox durability their ID is at or below the store's last ID, so the
   * outbox holds them; in reserve durability it is at or below the broker's last ID, and a broker
   * stores one producer's IDs in the order they were sent, so it holds them.
   */
  readonly mustBePresent = new Set<string>();
  /** Explicit mode: the ID the application's source gave each label, and the life that last sent it. */
  readonly explicitIds = new Map<string, bigint>();
  readonly #labelLife = new Map<string, number>();
  readonly violations: string[] = [];
  readonly rejections = new Map<DedupErrorCode | 'other', number>();
  /** Label → the code its last `send()` was rejected with (seen by a living process). */
  readonly rejected = new Map<string, DedupErrorCode | 'other'>();
  /** Settled sends (progress detection). */
  settled = 0;
  readonly #network: SimNetwork;
  readonly #diskOptions: ProcessDiskOptions;
  readonly #hooks: ConnectionHooks;
  #nextLabel = 0;
  #source = 0n;

  constructor(
    network: SimNetwork,
    spec: ProducerSpec,
    options: { readonly disk?: ProcessDiskOptions; readonly hooks?: ConnectionHooks } = {},
  ) {
    this.#network = network;
    this.spec = spec;
    this.#diskOptions = options.disk ?? {};
    this.#hooks = options.hooks ?? {};
  }

  get isRunning(): boolean {
    return this.life !== undefined;
  }

  get isConnected(): boolean {
    return this.life?.transport.connection?.state === 'live';
  }

  /** Progress counter for `settle()`. */
  progress(): number {
    return (this.life?.disk.calls ?? 0) + this.settled;
  }

  options(store: DedupStore): DedupPublisherOptions {
    return {
      producerName: this.spec.producerName,
      store,
      durability: this.spec.durability,
      idMode: this.spec.idMode,
      maxBatch: this.spec.maxBatch ?? 2_000,
      maxInFlight: this.spec.maxInFlight ?? 10_000,
      closeTimeoutMs: this.spec.closeTimeoutMs ?? 0,
      onBrokerAhead: this.spec.onBrokerAhead ?? 'error',
      reconnect: { initialDelayMs: 1, maxDelayMs: 2 },
    };
  }

  /**
   * Starts a process life. While the broker is down `open()` must fail with
   * `DEDUP_BROKER_UNREACHABLE` and the producer stays down; any other failure is returned.
   */
  async start(
    overrides: { readonly disk?: ProcessDiskOptions; readonly hooks?: ConnectionHooks } = {},
  ): Promise<DedupError | undefined> {
    if (this.life !== undefined) throw new Error('already running');
    const disk = new ProcessDisk(this.disk, overrides.disk ?? this.#diskOptions);
    const transport = this.#network.transport(
      this.spec.stream,
      this.spec.producerName,
      overrides.hooks ?? this.#hooks,
    );
    const store = await DedupStore.wrap(disk);
    let core: DedupPublisherCore;
    try {
      core = await DedupPublisherCore.open(transport, this.options(store));
    } catch (err) {
      if (!(err instanceof DedupError)) throw err;
      if (err.code !== 'DEDUP_BROKER_UNREACHABLE' || this.#network.brokerUp) {
        this.violations.push(`open: ${err.code} ${err.message}`);
      }
      return err;
    }
    this.lives++;
    this.life = {
      index: this.lives,
      disk,
      transport,
      core,
      unsettled: 0,
      crashed: false,
      closing: false,
      unsettledAtClose: -1,
      fresh: true,
    };
    this.history.push(this.life);
    // Explicit IDs: on startup the application first replays what its source had not seen confirmed.
    if (this.spec.idMode === 'explicit') this.replay();
    return undefined;
  }

  /** Sends `count` new messages (labels unique across lives); explicit IDs step by `gap`. */
  send(count: number, gap = 1): void {
    for (let i = 0; i < count; i++) {
      const label = `${this.spec.stream}/${this.spec.producerName}/${++this.#nextLabel}`;
      this.attempted.add(label);
      let publishingId: bigint | undefined;
      if (this.spec.idMode === 'explicit') {
        this.#source += BigInt(Math.max(1, gap));
        publishingId = this.#source;
        this.explicitIds.set(label, publishingId);
      }
      this.#send(label, publishingId, false);
    }
  }

  /**
   * Explicit mode, first thing in every life (`start()` calls it): the application re-sends, in ID
   * order and with their original IDs, the messages of earlier lives whose `send()` never resolved.
   * A replay refused with `DEDUP_ID_REGRESSION` must be in the stream: every earlier life replayed
   * before sending anything new, so in outbox durability an ID at or below the store's last one was
   * committed (and the outbox re-sends it); in reserve durability the refusal means it is at or
   * below the broker's last ID.
   */
  replay(): number {
    const life = this.life;
    if (life === undefined || !life.fresh || this.spec.idMode !== 'explicit') return 0;
    const labels = [...this.explicitIds.entries()]
      .filter(
        ([label]) =>
          !this.acknowledged.has(label) &&
          !this.mustBePresent.has(label) &&
          this.#labelLife.get(label) !== life.index,
      )
      .sort((a, b) => (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0));
    for (const [label, id] of labels) this.#send(label, id, true);
    return labels.length;
  }

  #send(label: string, publishingId: bigint | undefined, isReplay: boolean): void {
    const life = this.life;
    if (life === undefined) throw new Error('not running');
    life.fresh = false;
    life.unsettled++;
    this.#labelLife.set(label, life.index);
    life.core.send(Buffer.from(label), publishingId === undefined ? {} : { publishingId }).then(
      (result) => {
        life.unsettled--;
        this.settled++;
        if (life.crashed) return; // a dead process learns nothing
        if (publishingId !== undefined && result.publishingId !== publishingId) {
          this.violations.push(`${label} resolved with id ${result.publishingId}, sent with ${publishingId}`);
        }
        this.acknowledged.set(label, result.publishingId);
      },
      (err: unknown) => {
        life.unsettled--;
        this.settled++;
        if (life.crashed) return;
        const code = err instanceof DedupError ? err.code : 'other';
        this.rejections.set(code, (this.rejections.get(code) ?? 0) + 1);
        this.rejected.set(label, code);
        if (code === 'DEDUP_PUBLISHER_CLOSED' && life.closing) return;
        if (code === 'DEDUP_ID_REGRESSION' && isReplay) {
          this.mustBePresent.add(label);
          return;
        }
        this.violations.push(
          `${label} rejected: ${err instanceof Error ? `${code} ${err.message}` : String(err)}`,
        );
      },
    );
  }

  /** Lets a waiting reconnect through, once the core is in `connect()`. */
  async reconnect(): Promise<void> {
    const life = this.life;
    if (life === undefined || this.isConnected) return;
    // A core that is closing or failed may never ask: then its close ends the wait.
    await within(
      Promise.race([life.transport.connectAttempt(), life.core.closed()]),
      5_000,
      `${this.spec.producerName} reconnect`,
    );
    life.transport.acceptConnect();
  }

  /**
   * The process dies (SIGKILL): the first `applyHeld` held commits reached the disk, the rest did
   * not; the frames it wrote may still reach the broker (`zombie`). The core is abandoned, not closed.
   */
  async crash(zombie: boolean, applyHeld = 0): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    this.life = undefined;
    life.crashed = true;
    life.transport.kill(zombie);
    await life.disk.crash(applyHeld);
  }

  /**
   * Starts a graceful `close()`; the life ends when it resolves, and from then on the closed core
   * must not touch its disk again. Other events (confirms, cuts, crashes) may happen meanwhile.
   */
  beginClose(): void {
    const life = this.life;
    if (life === undefined || life.closing) return;
    life.closing = true;
    life.closed = life.core.close().then(() => {
      life.disk.sealed = true;
      life.unsettledAtClose = life.unsettled;
      if (this.life === life) this.life = undefined;
      this.settled++;
    });
  }

  /** A graceful `close()`, awaited. */
  async close(): Promise<void> {
    const life = this.life;
    if (life === undefined) return;
    this.beginClose();
    await within(life.closed!, 5_000, `${this.spec.producerName} close`);
  }

  /** Violations, including a closed core that touched its disk after `close()` resolved. */
  problems(): string[] {
    const out = [...this.violations];
    for (const life of this.history) {
      if (life.disk.afterSeal.length > 0) out.push(`write after close: ${life.disk.afterSeal.join('; ')}`);
    }
    return out;
  }
}
