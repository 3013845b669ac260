/**
 * Who wrote a changelog record and with which group settings: the settings string every record
 * carries, and the identity check a restore and a genesis read-back run on every record they read
 * (docs/design.md §12).
 */
import { DedupError } from '../errors.js';
import { holdsIdentity, parseIdentity, type MessageIdentity } from '../identity/headers.js';
import type { StreamMessage } from '../transport/stream-delivery.js';

/**
 * The header every changelog record carries with its writer's settings ({@link groupSettings}).
 *
 * @internal
 */
export const SETTINGS_HEADER = 'x-dedup-group-settings';

/**
 * What members of one group must agree on, as one string: the verifier policy, what is done with
 * unidentified messages, and whether scopes are per tenant. A function cannot be compared (its
 * source text differs between builds of the same code and is the same for closures over different
 * values): only whether there is one, and the `tenantVersion` its user names it by, where given
 * (last and JSON-quoted, so the string stays injective). Without one the string is 0.6.0's first
 * form (`tenant=function`), so members that name none still match records written before.
 * Members that differ mix verifier histories per key in the changelog.
 *
 * @internal
 */
export function groupSettings(
  o: {
    readonly policy: { readonly kind: string; readonly size?: number };
    readonly unidentified: string;
    readonly tenant: unknown;
  },
  tenantVersion?: string,
): string {
  const policy = o.policy.kind === 'window' ? `window:${o.policy.size}` : o.policy.kind;
  const tenant =
    o.tenant === undefined
      ? 'none'
      : tenantVersion === undefined
        ? 'function'
        : `function:${JSON.stringify(tenantVersion)}`;
  return `policy=${policy};unidentified=${o.unidentified};tenant=${tenant}`;
}

/**
 * The identity of changelog message `message`, which must be the group's own (`producerName`):
 * a record of another writer (another group whose changelog name was the same, under 0.5.0's
 * naming; anyone with write access) is never applied, never taken for a genesis.
 *
 * @throws DedupError `DEDUP_CHANGELOG_INVALID` for missing or malformed identity headers, or
 *   another producer's.
 *
 * @internal
 */
export function ownIdentity(
  message: Pick<StreamMessage, 'applicationProperties'>,
  producerName: string,
  where: string,
  settings?: string,
  seen?: { ownSettings: boolean },
): MessageIdentity {
  const headers = message.applicationProperties;
  const written: unknown = headers?.[SETTINGS_HEADER];
  // Records of 0.5.0 carry none: nothing to compare. Records of other settings *before* any of
  // this member's settings are a group that changed its settings while stopped (they stay in the
  // changelog for good: refusing them refused every later take-over); after one of ours, two
  // members live with different settings (hostile review of issue 32's change).
  if (settings !== undefined && written === settings && seen !== undefined) seen.ownSettings = true;
  if (
    settings !== undefined &&
    written !== undefined &&
    written !== settings &&
    (seen?.ownSettings ?? true)
  ) {
    throw new DedupError(
      'DEDUP_UNSAFE_OPTIONS',
      `changelog record ${where} was written by a member with other settings (${JSON.stringify(written)}) than ` +
        `this one's (${settings}): every member of a group must use the same policy, unidentified and tenant`,
    );
  }
  const identity = holdsIdentity(headers) ? parseIdentity(headers) : 'no identity headers';
  if (typeof identity === 'string') {
    throw new DedupError('DEDUP_CHANGELOG_INVALID', `changelog record ${where}: ${identity}`);
  }
  if (identity.producerName !== producerName) {
    throw new DedupError(
      'DEDUP_CHANGELOG_INVALID',
      `changelog record ${where} was written by ${JSON.stringify(identity.producerName)}, not by this ` +
        `group's ${JSON.stringify(producerName)}: another writer shares the changelog`,
    );
  }
  return identity;
}
