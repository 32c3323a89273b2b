import dns from 'node:dns';
import { vi } from 'vitest';

/**
 * Tests: makes `dns.lookup` answer 127.0.0.1 for `host` (a public-looking name that resolves to a
 * private address, as a DNS rebinding would), the real resolver for any other name. Undone by
 * `vi.restoreAllMocks()`.
 */
export function resolveToLoopback(host: string): void {
  const real = dns.lookup.bind(dns);
  vi.spyOn(dns, 'lookup').mockImplementation(((name: string, options: dns.LookupOptions, cb: (...a: unknown[]) => void) => {
    if (name !== host) return (real as (...a: unknown[]) => void)(name, options, cb);
    const a = { address: '127.0.0.1', family: 4 };
    process.nextTick(() => (options.all ? cb(null, [a]) : cb(null, a.address, a.family)));
  }) as never);
}
