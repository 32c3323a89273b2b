import https from 'node:https';
import Provider from 'oidc-provider';
import { listenLocal } from './local-https.js';

/**
 * A real OpenID Provider (oidc-provider) over HTTPS in the test process, for sign-in flows:
 * discovery, authorization with PKCE, dev interactions (any login and password sign in; the
 * user's claims are derived from the login), token, JWKS and userinfo endpoints.
 */

export interface TestIdp {
  issuer: string;
  port: number;
  /** Requests seen, `METHOD path` (for asserting what the ingress asked for). */
  requests: string[];
  close(): Promise<void>;
}

export interface TestIdpOptions {
  cert: string;
  key: string;
  clientId: string;
  clientSecret: string;
  redirectUris: string[];
  /** Host the issuer is named by (default 127.0.0.1, which the certificate must cover). */
  host?: string;
}

export async function startTestIdp(o: TestIdpOptions): Promise<TestIdp> {
  const host = o.host ?? '127.0.0.1';
  const requests: string[] = [];
  let provider: any;
  const server = https.createServer({ cert: o.cert, key: o.key }, (req, res) => {
    requests.push(`${req.method} ${req.url}`);
    provider.callback()(req, res);
  });
  const { port, close } = await listenLocal(server);
  const issuer = `https://${host}:${port}`;
  provider = new Provider(issuer, {
    clients: [
      {
        client_id: o.clientId,
        client_secret: o.clientSecret,
        redirect_uris: o.redirectUris,
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    async findAccount(_ctx: unknown, id: string) {
      return {
        accountId: id,
        async claims() {
          return { sub: id, email: `${id}@example.test`, email_verified: true, name: `${id[0]!.toUpperCase()}${id.slice(1)} Example` };
        },
      };
    },
    claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
    features: { devInteractions: { enabled: true } },
    pkce: { required: () => true },
    cookies: { keys: ['warren-e2e-idp-cookie-key'] },
    ttl: { Interaction: 600, Session: 3600, Grant: 3600, AccessToken: 600, IdToken: 600 },
  });
  // the dev-interaction and development-keys warnings are expected here
  provider.on?.('server_error', (_ctx: unknown, err: Error) => console.error('oidc-provider server_error', err));
  return {
    issuer,
    port,
    requests,
    close,
  };
}
