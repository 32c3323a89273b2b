import { startFakeGithub, type FakeGithub } from './github-fake.js';
import { startTestIdp, type TestIdp } from './oidc-idp.js';
import type { LocalTls } from './sign-in-cluster.js';

/**
 * The two local providers the `oauth` sign-ins are tested against (the route module and the
 * traffic policy action): the GitHub fake and a real OpenID Provider, both on the cluster's TLS.
 */
export interface OAuthTestProviders {
  gh: FakeGithub;
  idp: TestIdp;
  close(): Promise<void>;
}

export async function startOAuthTestProviders(
  tls: LocalTls,
  o: { github: { clientId: string; clientSecret: string }; idp: { clientId: string; clientSecret: string; redirectUris: string[] } },
): Promise<OAuthTestProviders> {
  const gh = await startFakeGithub({ cert: tls.cert, key: tls.key, ...o.github });
  const idp = await startTestIdp({ cert: tls.cert, key: tls.key, ...o.idp }).catch(async (e) => {
    await gh.close();
    throw e;
  });
  return { gh, idp, close: async () => void (await Promise.allSettled([gh.close(), idp.close()])) };
}
