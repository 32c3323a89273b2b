import { openSamlHandoff, openSamlLogoutBounce, SAML_LOGOUT_SECONDS, samlHandoffKey, sealSamlLogoutHandoff } from '@warren/shared';
import type { RouteStage, StageFactory } from '../pipeline/types.js';
import { enabledModule, moduleError } from './common.js';
import { deriveSessionKeys, routeBase, signInGate, type Identity, type SessionPolicy, type SignInModuleFields } from './oidc-session.js';

/**
 * `saml`: SAML 2.0 sign-in in front of a route, on the `oidc` module's machinery (oidc-session.ts
 * `signInGate`): reserved paths `<base>/.warren/saml/{callback,login,logout}`, 302 for browser
 * navigations and 401 (7106, `WWW-Authenticate: SAML realm=…, login=…`) otherwise,
 * `options_passthrough`, the sealed session cookie (`__Host-<cookie_prefix>saml` on HTTPS,
 * `<cookie_prefix>saml` on plain HTTP, as oidc.ts explains), `inactivity_timeout`,
 * `maximum_duration`, and the `ngrok-auth-user-*` headers (id: the NameID).
 *
 * The SAML service provider itself is central, on the control plane's public URL, as the API
 * says (`entity_id`, `assertion_consumer_service_url`, … under `<PUBLIC_BASE_URL>/saml/<route id>/`,
 * see services/control-plane/src/modules/https-edge-routes/saml.http.ts). This stage never sees
 * SAML XML:
 * 1. A browser without a session gets the pre-login cookie (state, return-to; as oidc) and a 302
 *    to the control plane's `…/saml/<route id>/login?state=<state>&redirect_uri=<callback URL>`.
 * 2. The control plane sends the browser to the IdP with a signed AuthnRequest, checks the IdP's
 *    answer at its ACS, and redirects to the callback with `state` and `handoff`: the identity,
 *    sealed (AES-256-GCM) with a key both sides derive from the route's `handoff_secret`, valid 60 s,
 *    bound to the callback URL and to the `state` of this browser's pre-login cookie.
 * 3. Here the callback opens the hand-off, checks both bindings, and sets the session cookie
 *    (which also keeps the NameID's format and qualifiers and the SessionIndex, for single logout).
 *
 * Single logout (front channel; the control plane's saml-slo.ts has the SAML side):
 * - `<base>/.warren/saml/logout` always clears this browser's session cookie. When the IdP has a
 *   single logout endpoint (`single_logout`) and the cookie held a session, the browser is then
 *   sent to `<logout_url>?token=…`: the session's NameID, its SLO details and where to return,
 *   sealed with the hand-off key (60 s), so that the control plane sends the IdP a signed
 *   LogoutRequest for exactly the session this browser had.
 * - `<base>/.warren/saml/logout?slo=…` is the IdP-initiated leg: the control plane verified the
 *   IdP's LogoutRequest and bounces the browser here with a sealed 60 s token; the cookie is
 *   cleared and the browser goes back to `<logout_url>?bounce=<the same token>` (never anywhere
 *   the token could name: `logout_url` is config), where the control plane answers the IdP.
 *   An invalid or expired token still clears the cookie, with a 400 (7112) page.
 * Sessions are stateless cookies: single logout ends the session in this browser only. A copy of
 * the cookie elsewhere stays valid until it expires (`maximum_duration`, `inactivity_timeout`).
 *
 * Pushed config (services/control-plane/src/config-push/dataplane.ts): the module as stored
 * without its SP signing key, plus `handoff_secret` (HKDF of that key), `login_url`, and
 * `logout_url` and `single_logout` (absent from control planes older than single logout).
 */

interface SamlModule extends SignInModuleFields {
  handoff_secret?: string;
  login_url?: string;
  /** The control plane's `…/saml/<route id>/logout`: both single logout hand-offs go there. */
  logout_url?: string;
  /** The IdP's metadata lists a single logout endpoint the control plane can send a LogoutRequest to. */
  single_logout?: boolean;
}

export interface SamlOptions {
  /** Clock in ms. */
  now?: () => number;
}

export function createSamlStage(opts: SamlOptions = {}): StageFactory {
  const nowMs = opts.now ?? Date.now;
  return (route, _edge, _config, deps): RouteStage | null => {
    const m = enabledModule<SamlModule>(route, 'saml');
    if (!m) return null;
    if (route.matchType === 'exact_path') throw new Error('saml: an exact_path route cannot carry the sign-in callback; use a path_prefix route');
    const secret = m.handoff_secret ?? '';
    const loginUrl = m.login_url ?? '';
    if (!secret || !loginUrl) throw new Error('saml: the control plane sent no hand-off secret or login URL for this route (is it older than this ingress?)');
    const logoutUrl = m.logout_url ?? '';
    try {
      new URL(loginUrl);
      if (logoutUrl) new URL(logoutUrl);
    } catch {
      throw new Error('saml: the login or logout URL is not a URL');
    }
    const base = routeBase(route);
    const policy: SessionPolicy = { maximumDuration: m.maximum_duration ?? 0, inactivityTimeout: m.inactivity_timeout ?? 0 };
    const handoffKey = samlHandoffKey(secret, route.id);
    return signInGate({
      module: 'saml',
      route,
      keys: deriveSessionKeys('saml', secret, route.id, 'saml', ''),
      policy,
      cookiePrefix: m.cookie_prefix || 'warren.',
      optionsPassthrough: m.options_passthrough === true,
      challenge: 'SAML',
      providerName: 'the SAML identity provider',
      providerLabel: new URL(loginUrl).origin,
      nowMs,
      log: deps.log.child({ module: 'saml', routeId: route.id }),
      provider: {
        authorizationUrl: async (login, redirectUri) => {
          const u = new URL(loginUrl);
          u.searchParams.set('state', login.state);
          u.searchParams.set('redirect_uri', redirectUri);
          return u;
        },
        exchange: async (url, login, redirectUri): Promise<Identity> => {
          const h = openSamlHandoff(handoffKey, url.searchParams.get('handoff'), Math.floor(nowMs() / 1000));
          if (!h) throw new Error('the sign-in hand-off is missing, expired or not authentic');
          if (h.st !== login.state || h.cb !== redirectUri) throw new Error('the sign-in hand-off belongs to another sign-in');
          return { sub: h.sub, email: h.email, name: h.name, ...(h.slo ? { slo: h.slo } : {}) };
        },
        logout: async (s, url, session, origin) => {
          const now = Math.floor(nowMs() / 1000);
          const bounce = url.searchParams.get('slo');
          if (bounce !== null) {
            // IdP-initiated: back to the control plane, which answers the IdP.
            if (!logoutUrl || !openSamlLogoutBounce(handoffKey, bounce, now)) {
              return moduleError(s, 7112, 'the single logout hand-off from the control plane is missing, expired or not authentic: this browser is signed out of this route, but the identity provider gets no answer from it');
            }
            const back = new URL(logoutUrl);
            back.searchParams.set('bounce', bounce);
            return back;
          }
          if (!logoutUrl || m.single_logout !== true || !session) return null;
          // The logout path is a GET, so another site can navigate a browser to it. That clears
          // this route's cookie (as before), but must not also sign the user out of every app
          // behind the IdP: single logout starts only from this origin, the address bar (`none`),
          // or a browser that sends no Fetch Metadata. `same-site` is refused too: other tenants'
          // edges may share the registrable domain.
          const site = s.req.headers['sec-fetch-site'];
          if (site !== undefined && site !== 'same-origin' && site !== 'none') return null;
          const next = new URL(logoutUrl);
          next.searchParams.set('token', sealSamlLogoutHandoff(handoffKey, { sub: session.sub, ...(session.slo ? { slo: session.slo } : {}), ret: `${origin}${base}/`, exp: now + SAML_LOGOUT_SECONDS }));
          return next;
        },
      },
    });
  };
}

export const samlStage: StageFactory = createSamlStage();
