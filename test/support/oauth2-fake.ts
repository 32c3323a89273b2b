import { createHash, randomBytes } from 'node:crypto';
import https from 'node:https';
import { SignJWT, exportJWK, generateKeyPair } from 'jose';
import { listenLocal } from './local-https.js';

/**
 * A small stand-in for an OAuth 2.0 / OpenID provider over HTTPS in the test process, strict about
 * what a given provider's documentation requires of the client (for the `oauth` module's
 * facebook, amazon, gitlab, linkedin, twitch and microsoft providers):
 *
 * - `GET <base>/.well-known/openid-configuration` (OpenID mode): the discovery document, naming
 *   `docIssuer` (e.g. Microsoft's `…/{tenantid}/v2.0` template) and endpoints under `publicOrigin`
 *   (the origin the client believes it talks to; a test fetch may map it to this server);
 * - `GET <base>/authorize`: signs in `signInAs` (no page) and redirects with `code` and `state`
 *   (or `error=access_denied` when null); each request's parameters are kept in `authorizations`;
 * - `POST <base>/token`: checks the client authentication (`auth`: HTTP Basic only, or the body
 *   only), the code, the redirect_uri and PKCE (`pkce`: required with S256, or refused when sent);
 *   answers an access token and, in OpenID mode, an ID token signed RS256 (JWKS at `<base>/jwks`)
 *   with `iss`, `aud`, `sub`, `nonce` (when the authorization had one) and the user's `idToken`
 *   claims (which may override `iss`);
 * - `GET <base>/userinfo` (OpenID) or `GET <userPath>` (OAuth 2.0 user API) with
 *   `Authorization: Bearer`; the user's `userinfo` object; each request kept in `userRequests`.
 */

export interface FakeOAuthUser {
  /** ID token claims (OpenID mode); `iss` here overrides the issuer. */
  idToken?: Record<string, unknown>;
  /** The userinfo / user API answer. */
  userinfo: Record<string, unknown>;
}

export interface FakeOAuth {
  origin: string;
  /** `publicOrigin` + `base`: the issuer to configure (OpenID) or the endpoints' prefix. */
  base: string;
  endpoints: { authorization: string; token: string; userinfo: string };
  users: Map<string, FakeOAuthUser>;
  signInAs: string | null;
  authorizations: URLSearchParams[];
  tokenRequests: Array<{ authorization: string | null; body: URLSearchParams }>;
  userRequests: Array<{ url: string; authorization: string | null }>;
  close(): Promise<void>;
}

export interface FakeOAuthOptions {
  cert: string;
  key: string;
  clientId: string;
  clientSecret: string;
  host?: string;
  mode: 'oidc' | 'oauth2';
  auth: 'basic' | 'post';
  pkce: 'required' | 'refused';
  /** Path prefix of every endpoint (default `/oauth`). */
  base?: string;
  /** The origin the endpoints are named by (default this server's). */
  publicOrigin?: string;
  /** The discovery document's `issuer` (default publicOrigin + base). */
  docIssuer?: string;
  /** OAuth 2.0 mode: the user API path, with its query (e.g. `/me?fields=id,name,email`). */
  userPath?: string;
}

export async function startFakeOAuth(o: FakeOAuthOptions): Promise<FakeOAuth> {
  const base = o.base ?? '/oauth';
  const { privateKey, publicKey } = await generateKeyPair('RS256');
  const jwk = { ...(await exportJWK(publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
  const codes = new Map<string, { login: string; redirectUri: string; challenge: string | null; nonce: string | null }>();
  const tokens = new Map<string, string>();
  const fake: Pick<FakeOAuth, 'users' | 'signInAs' | 'authorizations' | 'tokenRequests' | 'userRequests'> = { users: new Map(), signInAs: null, authorizations: [], tokenRequests: [], userRequests: [] };
  let pub = '';

  const json = (res: import('node:http').ServerResponse, status: number, body: unknown) => {
    res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
    res.end(JSON.stringify(body));
  };
  const tokenError = (res: import('node:http').ServerResponse, error: string, status = 400) => json(res, status, { error, error_description: error });

  const server = https.createServer({ cert: o.cert, key: o.key }, (req, res) => {
    const url = new URL(req.url ?? '/', 'https://fake.invalid');
    const issuer = pub + base;
    if (req.method === 'GET' && o.mode === 'oidc' && url.pathname === `${base}/.well-known/openid-configuration`) {
      return json(res, 200, {
        issuer: o.docIssuer ?? issuer,
        authorization_endpoint: `${issuer}/authorize`,
        token_endpoint: `${issuer}/token`,
        userinfo_endpoint: `${issuer}/userinfo`,
        jwks_uri: `${issuer}/jwks`,
        response_types_supported: ['code'],
        subject_types_supported: ['public'],
        id_token_signing_alg_values_supported: ['RS256'],
        token_endpoint_auth_methods_supported: [o.auth === 'basic' ? 'client_secret_basic' : 'client_secret_post'],
        ...(o.pkce === 'required' ? { code_challenge_methods_supported: ['S256'] } : {}),
      });
    }
    if (req.method === 'GET' && url.pathname === `${base}/jwks`) return json(res, 200, { keys: [jwk] });
    if (req.method === 'GET' && url.pathname === `${base}/authorize`) {
      const q = url.searchParams;
      fake.authorizations.push(q);
      if (q.get('client_id') !== o.clientId || q.get('response_type') !== 'code') return json(res, 400, { error: 'invalid_request' });
      if (o.pkce === 'required' && (!q.get('code_challenge') || q.get('code_challenge_method') !== 'S256')) return json(res, 400, { error: 'invalid_request', error_description: 'PKCE required' });
      if (o.pkce === 'refused' && q.has('code_challenge')) return json(res, 400, { error: 'invalid_request', error_description: 'PKCE not supported' });
      const redirect = new URL(q.get('redirect_uri') ?? '');
      if (fake.signInAs === null) redirect.searchParams.set('error', 'access_denied');
      else {
        const code = randomBytes(10).toString('hex');
        codes.set(code, { login: fake.signInAs, redirectUri: q.get('redirect_uri') ?? '', challenge: q.get('code_challenge'), nonce: q.get('nonce') });
        redirect.searchParams.set('code', code);
      }
      redirect.searchParams.set('state', q.get('state') ?? '');
      res.writeHead(302, { location: redirect.href });
      return res.end();
    }
    if (req.method === 'POST' && url.pathname === `${base}/token`) {
      let raw = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (raw += c));
      req.on('end', () => {
        void (async () => {
          const f = new URLSearchParams(raw);
          const authz = req.headers.authorization ?? null;
          fake.tokenRequests.push({ authorization: authz, body: f });
          if (o.auth === 'basic') {
            // RFC 6749 2.3.1: each of id and secret form-urlencoded, then `id:secret` in Base64
            const [id, secret] = Buffer.from((authz ?? '').replace(/^Basic /, ''), 'base64').toString().split(':').map((x) => new URLSearchParams(`v=${x}`).get('v'));
            if (!authz?.startsWith('Basic ') || id !== o.clientId || secret !== o.clientSecret || f.has('client_secret')) return tokenError(res, 'invalid_client', 401);
          } else if (authz !== null || f.get('client_id') !== o.clientId || f.get('client_secret') !== o.clientSecret) return tokenError(res, 'invalid_client', 401);
          if (f.get('grant_type') !== 'authorization_code') return tokenError(res, 'unsupported_grant_type');
          const g = codes.get(f.get('code') ?? '');
          codes.delete(f.get('code') ?? '');
          if (!g || g.redirectUri !== f.get('redirect_uri')) return tokenError(res, 'invalid_grant');
          if (g.challenge && createHash('sha256').update(f.get('code_verifier') ?? '').digest('base64url') !== g.challenge) return tokenError(res, 'invalid_grant');
          if (!g.challenge && f.has('code_verifier')) return tokenError(res, 'invalid_request');
          const token = randomBytes(16).toString('hex');
          tokens.set(token, g.login);
          const out: Record<string, unknown> = { access_token: token, token_type: 'bearer', expires_in: 3600 };
          if (o.mode === 'oidc') {
            const u = fake.users.get(g.login)!;
            const now = Math.floor(Date.now() / 1000);
            out.id_token = await new SignJWT({ iss: issuer, aud: o.clientId, iat: now, exp: now + 600, ...(g.nonce ? { nonce: g.nonce } : {}), ...u.idToken })
              .setProtectedHeader({ alg: 'RS256', kid: 'k1' })
              .sign(privateKey);
          }
          json(res, 200, out);
        })();
      });
      return;
    }
    const userPath = o.mode === 'oidc' ? `${base}/userinfo` : new URL(o.userPath ?? '/me', 'https://x.invalid').pathname;
    if (req.method === 'GET' && url.pathname === userPath) {
      const authz = req.headers.authorization ?? null;
      fake.userRequests.push({ url: `${url.pathname}${url.search}`, authorization: authz });
      const login = tokens.get((authz ?? '').replace(/^Bearer /i, ''));
      if (!login) return json(res, 401, { error: 'invalid_token' });
      return json(res, 200, fake.users.get(login)!.userinfo);
    }
    json(res, 404, { error: 'not found' });
  });
  const { port, close } = await listenLocal(server);
  const origin = `https://${o.host ?? '127.0.0.1'}:${port}`;
  pub = o.publicOrigin ?? origin;
  const b = pub + base;
  return Object.assign(fake, {
    origin,
    base: b,
    endpoints: { authorization: `${b}/authorize`, token: `${b}/token`, userinfo: o.mode === 'oidc' ? `${b}/userinfo` : pub + (o.userPath ?? '/me') },
    close,
  });
}
