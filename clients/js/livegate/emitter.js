// Listeners by event name: `on`, `off` and `emit`, shared by the client and its
// subscriptions, so that what a listener throws never reaches the code that emitted.

export class Listeners {
  constructor() {
    this._byName = new Map();
  }

  /** Adds `fn` to `name`'s listeners; returns a function that removes it. */
  on(name, fn) {
    if (!this._byName.has(name)) this._byName.set(name, new Set());
    this._byName.get(name).add(fn);
    return () => this.off(name, fn);
  }

  off(name, fn) {
    this._byName.get(name)?.delete(fn);
  }

  /** Whether `name` has a listener. */
  has(name) {
    return (this._byName.get(name)?.size ?? 0) > 0;
  }

  /**
   * Calls `name`'s listeners with `detail`, those added meanwhile not until the next
   * emit; what one throws goes to `onThrow(error)` and the next is called.
   */
  emit(name, detail, onThrow) {
    for (const fn of [...(this._byName.get(name) ?? [])]) {
      try {
        fn(detail);
      } catch (error) {
        onThrow(error);
      }
    }
  }
}
