import { StreamVerifyingConsumer, type StreamConnectionOptions } from '../../src/stream.js';

/** The consumer name test/fixtures/effects-consumer.ts verifies and applies under. */
export const EFFECTS_CONSUMER = 'cluster-effects';

/** What the effects consumer's store says of a run's acknowledged labels. */
export interface AppliedEffects {
  /** Acknowledged labels with no effect. */
  readonly missing: readonly string[];
  /** Acknowledged labels applied more than once. */
  readonly twice: readonly string[];
  /** The consumer's own count of labels applied a second time (any label). */
  readonly doubles: number;
}

/**
 * Reads the effects test/fixtures/effects-consumer.ts committed in `store` (`applied:<label>`, the
 * times applied, and `doubles`), through a verifying consumer opened on it that applies nothing.
 */
export async function readAppliedEffects(
  connection: StreamConnectionOptions,
  stream: string,
  store: string,
  acknowledged: readonly string[],
): Promise<AppliedEffects> {
  const check = await StreamVerifyingConsumer.open({
    connection,
    stream,
    consumerName: EFFECTS_CONSUMER,
    store,
    handler: () => undefined,
  });
  try {
    const missing: string[] = [];
    const twice: string[] = [];
    for (const label of acknowledged) {
      const raw = await check.readEffect(`applied:${label}`);
      if (raw === undefined) missing.push(label);
      else if (Buffer.from(raw).toString() !== '1') twice.push(label);
    }
    const doubles = Number(Buffer.from((await check.readEffect('doubles')) ?? Buffer.from('0')).toString());
    return { missing, twice, doubles };
  } finally {
    await check.close();
  }
}
