/** Polls `fn` every 10 ms until it returns a truthy value, which it resolves with; throws after `ms`. */
export async function until<T>(fn: () => T | undefined | null | false, ms = 5_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}
