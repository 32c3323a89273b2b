import express, { type NextFunction, type Request, type Response } from 'express';
import {
  AppError,
  errorCodeName,
  openSamlLogoutBounce,
  openSamlLogoutHandoff,
  SAML_HANDOFF_SECONDS,
  SAML_LOGOUT_SECONDS,
  samlHandoffKey,
  sealSamlHandoff,
  sealSamlLogoutBounce,
  type Logger,
} from '@warren/shared';
import type { Db } from '../../db/pool.js';
import { toAppError } from '../../http/error-handler.js';
import { acceptResponse, SamlRefused, spMetadata, startLogin, type SpContext } from './saml-sp.js';
import { acceptSloMessage, answerLogoutRequest, postBindingMessage, redirectBindingMessage, startLogout, type SloMessage } from './saml-slo.js';
import { samlHandoffSecret } from './saml.js';
import { samlRepo, type SamlRouteRow } from './saml.repo.js';

/**
 * The SAML service-provider endpoints of `saml` routes, on the control plane's public URL (the
 * URLs the API returns: `entity_id`/`metadata_url`, `assertion_consumer_service_url`,
 * `single_logout_url`). Browser-facing, so outside the management API: no API key, no version
 * header. Errors use the wire error body (JSON), or a small HTML page when the client accepts
 * text/html; bad input is a 4xx, never a 500.
 *
 * - `GET /saml/{route id}/metadata`: the SP metadata (entity id, ACS with HTTP-POST, SLO, the
 *   request-signing certificate, NameID format).
 * - `GET /saml/{route id}/login?state=…&redirect_uri=…`: started by the ingress (saml.ts there).
 *   `redirect_uri` must be `http(s)://<a hostport of the route's edge><prefix>/.warren/saml/callback`
 *   (no open redirect; the port is the scheme's default unless written, so an edge on `:443` takes
 *   only https on the default port); answers a 302 to the IdP's SSO URL with a signed AuthnRequest
 *   (HTTP-Redirect binding; an auto-posting form for an IdP with only HTTP-POST), RelayState a
 *   sealed (request id, state, redirect_uri), valid 10 minutes.
 * - `POST /saml/{route id}/acs`: the IdP's Response (HTTP-POST binding), checked by saml-sp.ts;
 *   then a 302 to `redirect_uri?state=…&handoff=…` (the identity and what single logout needs of
 *   it, NameID format and qualifiers and SessionIndex, sealed for the ingress, 60 s).
 *   An IdP-initiated Response (with `allow_idp_initiated`) is checked the same way, and the
 *   browser is then sent to the edge's `…/.warren/saml/login?return_to=<RelayState's path>`, so
 *   that its session comes from a sign-in bound to its own pre-login cookie (no session planted
 *   by a cross-site POST); the IdP usually answers that second request without a prompt.
 * - `GET|POST /saml/{route id}/slo`: the single logout service (saml-slo.ts has the checks): the
 *   IdP's LogoutResponse to our LogoutRequest (HTTP-Redirect or HTTP-POST binding) → a "signed
 *   out" page linking back to the edge; the IdP's LogoutRequest → a 302 to the logout path of the
 *   route's first edge origin, `<origin><prefix>/.warren/saml/logout?slo=<bounce>` (the bounce:
 *   the request's ID and RelayState, sealed for the ingress, 60 s), which clears that host's
 *   session cookie and comes back to `…/logout?bounce=`. Unsigned or invalid messages: 400 (7112).
 * - `GET /saml/{route id}/logout`: the edge's single logout hand-offs. `?token=` (SP-initiated,
 *   sealed by the edge from the session cookie it has just cleared, 60 s; its return URL must be
 *   on a hostport of the edge) → a 302 to the IdP's SingleLogoutService with a signed
 *   LogoutRequest for that session (NameID, SessionIndex). `?bounce=` (IdP-initiated) → the next
 *   edge origin's logout path, and after the last one a 302 to the IdP with our signed
 *   LogoutResponse (Success). Both tokens are sealed with the route's hand-off key under their own
 *   purposes: no one without the key can make one, so neither can be turned into a redirect
 *   elsewhere nor name another user's session. Front-channel logout ends the session of this
 *   browser only (sessions are stateless cookies: copies elsewhere stay valid until they expire).
 */

export interface SamlRouterOptions {
  db: Db;
  log: Logger;
  baseUrl: string;
}

const STATE = /^[A-Za-z0-9_-]{16,128}$/;
const htmlEscape = (v: string) => v.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/** The route's path prefix without a trailing slash, and its host when the match names one. */
function splitRouteMatch(match: string): { host: string | null; base: string } {
  const slash = match.indexOf('/');
  const host = slash === 0 ? null : (slash < 0 ? match : match.slice(0, slash)).toLowerCase();
  const path = slash < 0 ? '/' : match.slice(slash);
  return { host, base: path.endsWith('/') ? path.slice(0, -1) : path };
}

/**
 * `url` when it is an http(s) URL on a hostport of the route's edge (and on the host of its
 * match), else null. The port counts (the scheme's default when absent): a hand-off must not be
 * sent to another port of the hostname, nor over plain http to an edge whose hostports are 443.
 */
export function onEdge(row: Pick<SamlRouteRow, 'hostports' | 'match'>, raw: string): URL | null {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    return null;
  }
  if ((u.protocol !== 'https:' && u.protocol !== 'http:') || u.username || u.password) return null;
  const hostports = new Set(row.hostports.map((hp) => hp.toLowerCase()));
  const { host } = splitRouteMatch(row.match);
  const h = u.hostname.toLowerCase();
  const port = u.port || (u.protocol === 'https:' ? '443' : '80');
  if (!hostports.has(`${h}:${port}`) || (host !== null && host !== h)) return null;
  return u;
}

function fail(code: 4001 | 7109 | 7110 | 7111 | 7112, message: string): AppError {
  return new AppError(code, message.slice(0, 500));
}

/** The IdP-initiated logout visits at most this many origins (two redirects each; browsers stop at about 20). */
export const MAX_LOGOUT_ORIGINS = 8;

/**
 * The origins of the route's edge whose session cookies an IdP-initiated logout clears, in
 * hostport order: every hostport on the host of the match (every hostport when the match names
 * none); `https://` except on port 80, the port left out when it is the scheme's default.
 */
export function logoutOrigins(row: Pick<SamlRouteRow, 'hostports' | 'match'>): string[] {
  const { host } = splitRouteMatch(row.match);
  const out: string[] = [];
  for (const hp of row.hostports) {
    const i = hp.lastIndexOf(':');
    const h = hp.slice(0, i).toLowerCase();
    const port = hp.slice(i + 1);
    if (i <= 0 || (host !== null && host !== h)) continue;
    const origin = port === '80' ? `http://${h}` : port === '443' ? `https://${h}` : `https://${h}:${port}`;
    if (!out.includes(origin)) out.push(origin);
  }
  return out.slice(0, MAX_LOGOUT_ORIGINS);
}

/** A small HTML page of the SP endpoints. */
function htmlPage(res: Response, status: number, title: string, paragraphs: string[]): void {
  res
    .status(status)
    .setHeader('content-type', 'text/html; charset=utf-8')
    .setHeader('cache-control', 'no-store')
    .setHeader('referrer-policy', 'no-referrer')
    .end(`<!doctype html><html><head><meta charset="utf-8"><title>${htmlEscape(title)}</title></head><body><h1>${htmlEscape(title)}</h1>${paragraphs.map((p) => `<p>${p}</p>`).join('')}</body></html>\n`);
}

export function createSamlRouter(opts: SamlRouterOptions): express.Router {
  const { db, log, baseUrl } = opts;
  const router = express.Router({ caseSensitive: true });

  const context = async (routeId: string): Promise<{ row: SamlRouteRow; sp: SpContext }> => {
    if (!/^[A-Za-z0-9_]{1,64}$/.test(routeId)) throw fail(4001, 'no SAML route with this id');
    const row = await samlRepo.route(db, routeId);
    const saml = row?.modules.saml;
    if (!row || !saml || saml.enabled === false || !saml.signing?.private_key_pem) throw fail(4001, `no route with an enabled saml module has id ${routeId}`);
    return { row, sp: { routeId: row.id, baseUrl, module: saml } };
  };

  /** Wraps a handler: every throw becomes an error answer. */
  const handle = (fn: (req: Request, res: Response) => Promise<void>) => (req: Request, res: Response, next: NextFunction) => {
    fn(req, res).catch(next);
  };

  router.get(
    '/saml/:routeId/metadata',
    handle(async (req, res) => {
      const { sp } = await context(String(req.params.routeId));
      res.status(200).setHeader('content-type', 'application/samlmetadata+xml; charset=utf-8').setHeader('cache-control', 'no-cache').end(spMetadata(sp));
    }),
  );

  router.get(
    '/saml/:routeId/login',
    handle(async (req, res) => {
      const { row, sp } = await context(String(req.params.routeId));
      const state = typeof req.query.state === 'string' ? req.query.state : '';
      const redirect = typeof req.query.redirect_uri === 'string' ? req.query.redirect_uri : '';
      if (!STATE.test(state)) throw fail(7110, 'state is missing or malformed; start the sign-in from the protected URL');
      const cb = onEdge(row, redirect);
      const { base } = splitRouteMatch(row.match);
      if (!cb || cb.pathname !== `${base}/.warren/saml/callback` || cb.search || cb.hash)
        throw fail(7110, `redirect_uri must be the sign-in callback ${base}/.warren/saml/callback on a hostname of this route's edge`);
      let out: Awaited<ReturnType<typeof startLogin>>;
      try {
        out = await startLogin(sp, state, cb.href, Date.now());
      } catch (err) {
        throw fail(7110, `the route's SAML configuration cannot be used: ${(err as Error).message}`);
      }
      res.setHeader('cache-control', 'no-store');
      if ('redirect' in out) res.redirect(302, out.redirect);
      else res.status(200).setHeader('content-type', 'text/html; charset=utf-8').end(out.form);
    }),
  );

  router.post(
    '/saml/:routeId/acs',
    express.urlencoded({ extended: false, limit: '2mb', parameterLimit: 10 }),
    handle(async (req, res) => {
      const { row, sp } = await context(String(req.params.routeId));
      const body = (req.body ?? {}) as Record<string, unknown>;
      const samlResponse = typeof body.SAMLResponse === 'string' ? body.SAMLResponse : '';
      const relayState = typeof body.RelayState === 'string' ? body.RelayState : undefined;
      if (!samlResponse) throw fail(7111, 'SAMLResponse is missing: the IdP must POST it as a form field (HTTP-POST binding)');
      let ok: Awaited<ReturnType<typeof acceptResponse>>;
      try {
        ok = await acceptResponse(sp, samlResponse, relayState, Date.now(), (id, exp) => samlRepo.remember(db, row.id, id, new Date(exp)));
      } catch (err) {
        if (err instanceof SamlRefused) {
          log.info({ route: row.id, reason: err.message, ...(err.detail ? { detail: err.detail } : {}) }, 'saml: response refused');
          throw fail(err.code, err.message);
        }
        throw err;
      }
      res.setHeader('cache-control', 'no-store');
      const { base } = splitRouteMatch(row.match);
      if (ok.relay) {
        const cb = onEdge(row, ok.relay.callbackUrl);
        if (!cb) throw fail(7110, 'the sign-in was started for a hostname this route no longer has; start again');
        const secret = samlHandoffSecret(sp.module.signing.private_key_pem, row.id);
        const handoff = sealSamlHandoff(samlHandoffKey(secret, row.id), { ...ok.identity, slo: ok.logout, st: ok.relay.state, cb: cb.href, exp: Math.floor(Date.now() / 1000) + SAML_HANDOFF_SECONDS });
        cb.searchParams.set('state', ok.relay.state);
        cb.searchParams.set('handoff', handoff);
        res.redirect(302, cb.href);
        return;
      }
      // IdP-initiated: sign in again from the edge, bound to this browser (see above).
      const target = ok.target ? onEdge(row, ok.target) : null;
      const host = target?.host ?? row.hostports[0]?.replace(/:443$/, '');
      if (!host) throw fail(7110, "the route's edge has no hostname");
      const scheme = target?.protocol ?? 'https:';
      const returnTo = target ? target.pathname + target.search : ok.target?.startsWith('/') && !ok.target.startsWith('//') ? ok.target : base || '/';
      res.redirect(302, `${scheme}//${host}${base}/.warren/saml/login?return_to=${encodeURIComponent(returnTo)}`);
    }),
  );

  /** The route's hand-off key (the edge has it too). */
  const handoffKeyOf = (sp: SpContext) => samlHandoffKey(samlHandoffSecret(sp.module.signing.private_key_pem, sp.routeId), sp.routeId);
  const refusedAs = (row: SamlRouteRow, what: string) => (err: unknown) => {
    if (!(err instanceof SamlRefused)) throw err;
    log.info({ route: row.id, reason: err.message, ...(err.detail ? { detail: err.detail } : {}) }, `saml: ${what} refused`);
    throw fail(err.code, err.message);
  };
  /** IdP-initiated: the browser to the logout path of the route's origin `h`, with the sealed bounce. */
  const bounceTo = (res: Response, row: SamlRouteRow, sp: SpContext, origin: string, b: { id: string; rs: string; h: number }) => {
    const token = sealSamlLogoutBounce(handoffKeyOf(sp), { ...b, exp: Math.floor(Date.now() / 1000) + SAML_LOGOUT_SECONDS });
    res.redirect(302, `${origin}${splitRouteMatch(row.match).base}/.warren/saml/logout?slo=${encodeURIComponent(token)}`);
  };
  /** IdP-initiated, last step: our LogoutResponse to the IdP, or a page when it has no endpoint for it. */
  const answerIdp = async (res: Response, sp: SpContext, id: string, relayState: string) => {
    let url: string | null;
    try {
      url = await answerLogoutRequest(sp, id, relayState);
    } catch (err) {
      throw fail(7110, `the route's SAML configuration cannot be used: ${(err as Error).message}`);
    }
    if (url) return void res.redirect(302, url);
    htmlPage(res, 200, 'Signed out', ["You are signed out of this route in this browser. The identity provider's metadata lists no single logout endpoint with the HTTP-Redirect binding, so it gets no answer from this service."]);
  };

  router.get(
    '/saml/:routeId/logout',
    handle(async (req, res) => {
      const { row, sp } = await context(String(req.params.routeId));
      res.setHeader('cache-control', 'no-store');
      const now = Math.floor(Date.now() / 1000);
      const key = handoffKeyOf(sp);
      if (typeof req.query.bounce === 'string') {
        const b = openSamlLogoutBounce(key, req.query.bounce, now);
        if (!b) throw fail(7112, 'the single logout hand-off is missing, expired or not authentic; the identity provider gets no answer');
        const origins = logoutOrigins(row);
        if (b.h + 1 < origins.length) return bounceTo(res, row, sp, origins[b.h + 1]!, { id: b.id, rs: b.rs, h: b.h + 1 });
        return answerIdp(res, sp, b.id, b.rs);
      }
      const h = openSamlLogoutHandoff(key, typeof req.query.token === 'string' ? req.query.token : null, now);
      if (!h) throw fail(7112, 'the logout hand-off is missing, expired or not authentic; sign out again from the protected site');
      const { base } = splitRouteMatch(row.match);
      const ret = onEdge(row, h.ret);
      if (!ret || ret.pathname !== `${base}/` || ret.search || ret.hash) throw fail(7112, 'the logout hand-off returns to a URL that is not this route on a hostname of its edge');
      let url: string | null;
      try {
        url = await startLogout(sp, h, Date.now());
      } catch (err) {
        throw fail(7110, `the route's SAML configuration cannot be used: ${(err as Error).message}`);
      }
      if (url) return void res.redirect(302, url);
      htmlPage(res, 200, 'Signed out', [
        `You are signed out of ${htmlEscape(ret.host)} in this browser. The identity provider has no single logout endpoint this service can use, so your session there continues.`,
        `<a href="${htmlEscape(ret.href)}">Sign in again</a>`,
      ]);
    }),
  );

  const slo = handle(async (req, res) => {
    const { row, sp } = await context(String(req.params.routeId));
    res.setHeader('cache-control', 'no-store');
    let message: SloMessage;
    let out: Awaited<ReturnType<typeof acceptSloMessage>>;
    try {
      if (req.method === 'GET') {
        const q = req.originalUrl.indexOf('?');
        message = redirectBindingMessage(q < 0 ? '' : req.originalUrl.slice(q + 1));
      } else {
        message = postBindingMessage((req.body ?? {}) as Record<string, unknown>);
      }
      out = await acceptSloMessage(sp, message, Date.now(), (id, exp) => samlRepo.remember(db, row.id, id, new Date(exp)));
    } catch (err) {
      return refusedAs(row, 'logout message')(err);
    }
    if (out.kind === 'logged-out') {
      const ret = onEdge(row, out.ret);
      htmlPage(res, 200, 'Signed out', [
        `You are signed out${ret ? ` of ${htmlEscape(ret.host)}` : ''} in this browser and at the identity provider.`,
        ...(ret ? [`<a href="${htmlEscape(ret.href)}">Sign in again</a>`] : []),
      ]);
      return;
    }
    log.info({ route: row.id, request: out.id.slice(0, 100), binding: message.binding }, 'saml: IdP-initiated logout');
    const origins = logoutOrigins(row);
    if (origins.length === 0) return answerIdp(res, sp, out.id, out.relayState);
    bounceTo(res, row, sp, origins[0]!, { id: out.id, rs: out.relayState, h: 0 });
  });
  router.get('/saml/:routeId/slo', slo);
  router.post('/saml/:routeId/slo', express.urlencoded({ extended: false, limit: '2mb', parameterLimit: 10 }), slo);

  router.all('/saml/:routeId/:endpoint', (req: Request, _res: Response, next: NextFunction) => {
    next(['metadata', 'login', 'acs', 'slo', 'logout'].includes(String(req.params.endpoint)) ? new AppError(2010, 'method not allowed on this SAML endpoint') : new AppError(4000, 'no such SAML endpoint'));
  });

  // Errors of these endpoints: the wire error body, or an HTML page for browsers.
  router.use('/saml', (err: unknown, req: Request, res: Response, _next: NextFunction) => {
    const e = err as { type?: string; status?: number };
    const signOut = /\/(slo|logout)$/.test(req.path);
    const appErr =
      err instanceof AppError
        ? err
        : e?.type === 'entity.too.large'
          ? signOut
            ? new AppError(7112, 'the form body is over 2 MiB')
            : new AppError(7111, 'the SAMLResponse is over 2 MiB')
          : // body-parser's other refusals of the request (400, and 415 for an unsupported charset or content-encoding)
            e?.status === 400 || (typeof e?.type === 'string' && typeof e?.status === 'number' && e.status >= 400 && e.status < 500) || e?.type === 'entity.parse.failed' || e?.type === 'parameters.too.many'
            ? new AppError(signOut ? 7112 : 7111, 'the form body could not be read')
            : toAppError(err, req.method);
    const opId = res.locals.operationId as string;
    if (appErr.status >= 500) log.error({ err, op: opId, path: req.path }, 'saml endpoint failed');
    if (res.headersSent) return void res.end();
    for (const [k, v] of Object.entries(appErr.headers)) res.setHeader(k, v);
    const name = errorCodeName(appErr.code);
    res.status(appErr.status).setHeader('cache-control', 'no-store');
    if ((req.headers.accept ?? '').includes('text/html')) {
      res
        .setHeader('content-type', 'text/html; charset=utf-8')
        .end(
          `<!doctype html><html><head><meta charset="utf-8"><title>${appErr.status} ${name}</title></head><body><h1>${signOut ? 'Sign-out failed' : 'Sign-in failed'}</h1><p>${htmlEscape(appErr.message)}</p><p><code>${name}</code> · ${htmlEscape(opId ?? '')}</p></body></html>\n`,
        );
      return;
    }
    res.json({ error_code: name, status_code: appErr.status, msg: appErr.message, details: { ...appErr.details, operation_id: opId } });
  });
  return router;
}
