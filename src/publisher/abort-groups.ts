/**
 * The sends waiting on each caller's `AbortSignal`: one listener per signal, not one per send.
 * Node's EventTarget scans a signal's listeners on every add and every remove, so a signal shared
 * by n sends (the ordinary request- or shutdown-scoped one) cost O(n²) to register and again to
 * abort: 2.4 s to add 20 000 listeners (issue 32, item 9). Here a send joins and leaves its
 * signal's group in O(1), and an abort hands the whole group over at once.
 */

/** The sends of one signal. */
export class AbortGroup<E> {
  readonly #members = new Set<E>();
  readonly #signal: AbortSignal;
  readonly #owner: AbortGroups<E>;
  readonly #listener = (): void => this.#fire();

  constructor(signal: AbortSignal, owner: AbortGroups<E>) {
    this.#signal = signal;
    this.#owner = owner;
    signal.addEventListener('abort', this.#listener, { once: true });
  }

  add(member: E): void {
    this.#members.add(member);
  }

  /** A member settled: it stops listening; the last one out removes the listener. */
  leave(member: E): void {
    if (!this.#members.delete(member) || this.#members.size > 0) return;
    this.#signal.removeEventListener('abort', this.#listener);
    this.#owner.forget(this.#signal, this);
  }

  #fire(): void {
    const members = [...this.#members];
    this.#members.clear();
    this.#owner.forget(this.#signal, this);
    this.#owner.aborted(members, this.#signal);
  }
}

export class AbortGroups<E> {
  readonly #groups = new Map<AbortSignal, AbortGroup<E>>();

  /** `aborted` gets the members of an aborted signal, in the order they joined (ID order). */
  constructor(readonly aborted: (members: readonly E[], signal: AbortSignal) => void) {}

  /** Adds a send to its signal's group (made, with its one listener, for the first). */
  join(signal: AbortSignal, member: E): AbortGroup<E> {
    let group = this.#groups.get(signal);
    if (group === undefined) {
      group = new AbortGroup(signal, this);
      this.#groups.set(signal, group);
    }
    group.add(member);
    return group;
  }

  /** @internal A group emptied or fired: the next send with its signal makes a new one. */
  forget(signal: AbortSignal, group: AbortGroup<E>): void {
    if (this.#groups.get(signal) === group) this.#groups.delete(signal);
  }
}
