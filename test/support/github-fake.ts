import { createHash, randomBytes } from 'node:crypto';
import https from 'node:https';
import { listenLocal } from './local-https.js';

/**
 * A small stand-in for GitHub's OAuth web flow and the REST endpoints the `oauth` module reads,
 * over HTTPS in the test process (as GitHub Enterprise Server lays them out: `/login/oauth/…` and
 * the API under `/api/v3`):
 *
 * - `GET /login/oauth/authorize`: signs in `signInAs` (no page) and redirects to `redirect_uri`
 *   with `code` and `state` (or `error=access_denied` when `signInAs` is null);
 * - `POST /login/oauth/access_token`: form body with client_id, client_secret, code,
 *   redirect_uri and (when the authorization had a challenge) code_verifier; JSON answer;
 * - `GET /api/v3/user`, `/user/emails`, `/user/orgs`, `/user/teams` with `Authorization: Bearer`,
 *   paginated by `per_page` with `Link: <…>; rel="next"` like GitHub; `delays` holds back an
 *   API path's answers (a slow GitHub).
 */

export interface FakeGithubUser {
  id: number;
  login: string;
  name: string | null;
  emails: Array<{ email: string; verified: boolean; primary: boolean }>;
  orgs: string[];
  /** `org/team-slug` */
  teams: string[];
}

export interface FakeGithub {
  origin: string;
  /** The endpoints for WARREN_OAUTH_PROVIDER_ENDPOINTS.github. */
  endpoints: { authorization: string; token: string; api: string };
  users: Map<string, FakeGithubUser>;
  /** Who the next authorization signs in; null: the user refuses (error=access_denied). */
  signInAs: string | null;
  /** Requests seen, `METHOD path?query` (tokens never appear in URLs). */
  requests: string[];
  /** The `scope` of each authorization request. */
  scopes: string[];
  /** Milliseconds to wait before answering an API path (`/user/orgs`, without `/api/v3`); empty by default. */
  delays: Map<string, number>;
  close(): Promise<void>;
}

interface Grant {
  login: string;
  clientId: string;
  redirectUri: string;
  challenge: string | null;
  scope: string;
}

export async function startFakeGithub(o: { cert: string; key: string; clientId: string; clientSecret: string; host?: string }): Promise<FakeGithub> {
  const codes = new Map<string, Grant>();
  const tokens = new Map<string, { login: string; scope: string }>();
  const fake: Omit<FakeGithub, 'origin' | 'endpoints' | 'close'> = { users: new Map(), signInAs: null, requests: [], scopes: [], delays: new Map() };

  const json = (res: import('node:http').ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
    res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', ...headers });
    res.end(JSON.stringify(body));
  };

  const server = https.createServer({ cert: o.cert, key: o.key }, (req, res) => {
    const url = new URL(req.url ?? '/', origin);
    fake.requests.push(`${req.method} ${url.pathname}${url.search}`);
    if (req.method === 'GET' && url.pathname === '/login/oauth/authorize') {
      const q = url.searchParams;
      const redirect = new URL(q.get('redirect_uri') ?? '');
      fake.scopes.push(q.get('scope') ?? '');
      if (q.get('client_id') !== o.clientId) return json(res, 400, { error: 'unknown client' });
      if (fake.signInAs === null) {
        redirect.searchParams.set('error', 'access_denied');
        redirect.searchParams.set('error_description', 'The user has denied your application access.');
      } else {
        const code = randomBytes(10).toString('hex');
        codes.set(code, { login: fake.signInAs, clientId: o.clientId, redirectUri: redirect.href, challenge: q.get('code_challenge'), scope: q.get('scope') ?? '' });
        redirect.searchParams.set('code', code);
      }
      redirect.searchParams.set('state', q.get('state') ?? '');
      res.writeHead(302, { location: redirect.href });
      return res.end();
    }
    if (req.method === 'POST' && url.pathname === '/login/oauth/access_token') {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (body += c));
      req.on('end', () => {
        const f = new URLSearchParams(body);
        // GitHub answers errors with 200 and an error object
        if (f.get('client_id') !== o.clientId || f.get('client_secret') !== o.clientSecret) return json(res, 200, { error: 'incorrect_client_credentials' });
        const g = codes.get(f.get('code') ?? '');
        codes.delete(f.get('code') ?? '');
        if (!g || g.redirectUri !== f.get('redirect_uri')) return json(res, 200, { error: 'bad_verification_code' });
        if (g.challenge && createHash('sha256').update(f.get('code_verifier') ?? '').digest('base64url') !== g.challenge) return json(res, 200, { error: 'bad_verification_code' });
        const token = `gho_${randomBytes(16).toString('hex')}`;
        tokens.set(token, { login: g.login, scope: g.scope });
        json(res, 200, { access_token: token, token_type: 'bearer', scope: g.scope.replace(/ /g, ',') });
      });
      return;
    }
    if (req.method === 'GET' && url.pathname.startsWith('/api/v3/')) {
      const delay = fake.delays.get(url.pathname.slice('/api/v3'.length)) ?? 0;
      if (delay > 0) return void setTimeout(() => !res.destroyed && api(req, res, url), delay);
      return api(req, res, url);
    }
    json(res, 404, { message: 'Not Found' });
  });
  /** GitHub's REST API (`/api/v3/…`) with the user's token. */
  const api = (req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse, url: URL) => {
    const auth = req.headers.authorization ?? '';
    const t = tokens.get(auth.replace(/^(Bearer|token) /i, ''));
    if (!t) return json(res, 401, { message: 'Bad credentials' });
    const u = fake.users.get(t.login);
    if (!u) return json(res, 404, { message: 'Not Found' });
    const scopes = t.scope.split(/[ ,]+/);
    const page = <T>(items: T[]) => {
      const per = Math.max(1, Math.min(100, Number(url.searchParams.get('per_page') ?? 30)));
      const n = Math.max(1, Number(url.searchParams.get('page') ?? 1));
      const headers: Record<string, string> = {};
      if (n * per < items.length) {
        const next = new URL(url);
        next.searchParams.set('page', String(n + 1));
        headers.link = `<${next.href}>; rel="next"`;
      }
      json(res, 200, items.slice((n - 1) * per, n * per), headers);
    };
    switch (url.pathname.slice('/api/v3'.length)) {
      case '/user':
        return json(res, 200, { id: u.id, login: u.login, name: u.name, email: u.emails.find((e) => e.primary)?.email ?? null });
      case '/user/emails':
        if (!scopes.includes('user:email') && !scopes.includes('user')) return json(res, 404, { message: 'Not Found' });
        return page(u.emails);
      case '/user/orgs':
        // without read:org only public memberships show; the fake treats them all as private
        return page(scopes.includes('read:org') ? u.orgs.map((login) => ({ login })) : []);
      case '/user/teams':
        if (!scopes.includes('read:org')) return json(res, 403, { message: 'Resource not accessible' });
        return page(u.teams.map((t) => ({ slug: t.split('/')[1], organization: { login: t.split('/')[0] } })));
      default:
        return json(res, 404, { message: 'Not Found' });
    }
  };
  const { port, close } = await listenLocal(server);
  const origin = `https://${o.host ?? '127.0.0.1'}:${port}`;
  return Object.assign(fake, {
    origin,
    endpoints: { authorization: `${origin}/login/oauth/authorize`, token: `${origin}/login/oauth/access_token`, api: `${origin}/api/v3` },
    close,
  });
}
