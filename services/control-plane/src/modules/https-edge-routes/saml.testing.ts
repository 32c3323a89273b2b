import { expect } from 'vitest';
import { SamlRefused, type ReplayStore } from './saml-sp.js';

/** Test helpers shared by the SAML SP unit tests (saml-sp, saml-slo). */

/** A replay store in memory: each id is accepted once. */
export function memoryReplay(): ReplayStore {
  const seen = new Set<string>();
  return async (id) => {
    if (seen.has(id)) return false;
    seen.add(id);
    return true;
  };
}

/** The SamlRefused a promise rejects with (fails the test when it resolves or rejects otherwise). */
export async function refusal(p: Promise<unknown>, what = ''): Promise<SamlRefused> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(err, what).toBeInstanceOf(SamlRefused);
  return err as SamlRefused;
}
