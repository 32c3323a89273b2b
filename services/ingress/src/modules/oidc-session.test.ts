import { describe, expect, it } from 'vitest';
import {
  DEFAULT_MAXIMUM_DURATION,
  MAX_RETURN_TO_CHARS,
  addSetCookie,
  boundReturnTo,
  deriveOidcKeys,
  getCookie,
  headerValue,
  needsRefresh,
  newSession,
  readLoginState,
  readSession,
  sanitizeReturnTo,
  seal,
  sessionCookieName,
  setCookie,
  stripIdentityHeaders,
  unseal,
  withoutCookies,
} from './oidc-session.js';

const keys = deriveOidcKeys('s3cret', 'edghtsrt_1', 'https://id.example.test', 'client');
const T = 1_800_000_000;
const ident = { sub: 'u1', email: 'a@example.test', name: 'Ann' };

describe('oidc cookie crypto', () => {
  it('derives the same keys from the same config, and other keys from any other input', () => {
    const again = deriveOidcKeys('s3cret', 'edghtsrt_1', 'https://id.example.test', 'client');
    expect(again.session.equals(keys.session)).toBe(true);
    expect(keys.session.length).toBe(32);
    expect(keys.session.equals(keys.login)).toBe(false);
    for (const other of [
      deriveOidcKeys('s3cret2', 'edghtsrt_1', 'https://id.example.test', 'client'),
      deriveOidcKeys('s3cret', 'edghtsrt_2', 'https://id.example.test', 'client'),
      deriveOidcKeys('s3cret', 'edghtsrt_1', 'https://id2.example.test', 'client'),
      deriveOidcKeys('s3cret', 'edghtsrt_1', 'https://id.example.test', 'client2'),
    ]) expect(other.session.equals(keys.session)).toBe(false);
  });

  it('round-trips, with a fresh IV each time', () => {
    const a = seal(keys.session, 'session', { x: 1 });
    const b = seal(keys.session, 'session', { x: 1 });
    expect(a).not.toBe(b);
    expect(a).toMatch(/^v1\.[A-Za-z0-9_-]+$/);
    expect(unseal(keys.session, 'session', a)).toEqual({ x: 1 });
  });

  it('refuses tampering, another key, another purpose and garbage', () => {
    const v = seal(keys.session, 'session', { x: 1 });
    const raw = Buffer.from(v.slice(3), 'base64url');
    for (const i of [0, 13, raw.length - 1]) {
      const t = Buffer.from(raw);
      t[i]! ^= 1;
      expect(unseal(keys.session, 'session', `v1.${t.toString('base64url')}`)).toBeNull();
    }
    expect(unseal(keys.login, 'session', v)).toBeNull();
    expect(unseal(keys.session, 'login', v)).toBeNull();
    for (const g of [undefined, '', 'v1.', 'v2.' + v.slice(3), 'v1.!!!', 'v1.AAAA', 'x'.repeat(5000)]) expect(unseal(keys.session, 'session', g)).toBeNull();
  });
});

describe('oidc session expiry', () => {
  const cookie = (s: object) => seal(keys.session, 'session', s);

  it('honours maximum_duration (default one day) from sign-in', () => {
    const p = { maximumDuration: 60, inactivityTimeout: 0 };
    const s = newSession(ident, T, p);
    expect(s.exp).toBe(T + 60);
    expect(readSession(keys.session, cookie(s), T + 59, p)).toMatchObject(ident);
    expect(readSession(keys.session, cookie(s), T + 60, p)).toBeNull();
    const d = { maximumDuration: 0, inactivityTimeout: 0 };
    const sd = newSession(ident, T, d);
    expect(readSession(keys.session, cookie(sd), T + DEFAULT_MAXIMUM_DURATION - 1, d)).not.toBeNull();
    expect(readSession(keys.session, cookie(sd), T + DEFAULT_MAXIMUM_DURATION, d)).toBeNull();
    // a lowered maximum_duration also ends sessions issued under the old one
    expect(readSession(keys.session, cookie(sd), T + 61, p)).toBeNull();
  });

  it('honours inactivity_timeout from the last-seen time', () => {
    const p = { maximumDuration: 3600, inactivityTimeout: 300 };
    const s = newSession(ident, T, p);
    expect(readSession(keys.session, cookie(s), T + 299, p)).not.toBeNull();
    expect(readSession(keys.session, cookie(s), T + 300, p)).toBeNull();
    expect(readSession(keys.session, cookie({ ...s, seen: T + 200 }), T + 499, p)).not.toBeNull();
  });

  it('refreshes a sliding session at most once a minute, and only a sliding one', () => {
    const p = { maximumDuration: 3600, inactivityTimeout: 300 };
    const s = newSession(ident, T, p);
    expect(needsRefresh(s, T + 59, p)).toBe(false);
    expect(needsRefresh(s, T + 60, p)).toBe(true);
    expect(needsRefresh(s, T + 600, { maximumDuration: 3600, inactivityTimeout: 0 })).toBe(false);
  });

  it('refuses malformed sessions and times from the future', () => {
    const p = { maximumDuration: 3600, inactivityTimeout: 0 };
    const s = newSession(ident, T, p);
    expect(readSession(keys.session, cookie({ ...s, sub: '' }), T, p)).toBeNull();
    expect(readSession(keys.session, cookie({ ...s, iat: 'x' }), T, p)).toBeNull();
    expect(readSession(keys.session, cookie({ ...s, iat: T + 3600, seen: T + 3600, exp: T + 7200 }), T, p)).toBeNull();
    expect(readSession(keys.session, seal(keys.login, 'login', s), T, p)).toBeNull();
  });

  it('reads the pre-login state only while it is fresh', () => {
    const l = { state: 's', nonce: 'n', verifier: 'v', returnTo: '/x', exp: T + 600 };
    expect(readLoginState(keys.login, seal(keys.login, 'login', l), T)).toEqual(l);
    expect(readLoginState(keys.login, seal(keys.login, 'login', l), T + 600)).toBeNull();
    expect(readLoginState(keys.login, seal(keys.session, 'login', l), T)).toBeNull();
  });
});

describe('oidc return-to', () => {
  const reserved = (p: string) => p.startsWith('/.warren/oidc/');
  it('keeps same-host relative paths with their query', () => {
    expect(sanitizeReturnTo('/a/b?c=d&e', '/')).toBe('/a/b?c=d&e');
    expect(sanitizeReturnTo('/', '/x')).toBe('/');
    expect(sanitizeReturnTo('/a/../b', '/')).toBe('/b');
  });
  it('refuses anything that could leave the host', () => {
    for (const bad of ['https://evil.test/', '//evil.test/x', '/\\evil.test', '\\\\evil.test', 'evil.test', 'javascript:alert(1)', '/\t/evil.test', '/a\r\nSet-Cookie: x', '', null, undefined, '/' + 'a'.repeat(3000)]) {
      expect(sanitizeReturnTo(bad, '/home')).toBe('/home');
    }
  });
  it('refuses dot segments that resolve to a scheme-relative //host (open redirect)', () => {
    for (const bad of ['/.//evil.test', '/..//evil.test/x', '/a/..//evil.test', '/%2e//evil.test', '/%2E%2E//evil.test?q=1']) {
      expect(sanitizeReturnTo(bad, '/home')).toBe('/home');
    }
    expect(sanitizeReturnTo('/a/.//b', '/home')).toBe('/a//b');
  });
  it('refuses the reserved paths', () => {
    expect(sanitizeReturnTo('/.warren/oidc/logout', '/', reserved)).toBe('/');
    expect(sanitizeReturnTo('/./.warren/oidc/callback?x', '/', reserved)).toBe('/');
  });
});

describe('oidc return-to kept in the pre-login cookie (cookie bomb; audit)', () => {
  it('is at most MAX_RETURN_TO_CHARS: a longer one without its query, else the fallback', () => {
    expect(MAX_RETURN_TO_CHARS).toBe(512);
    const q = `/page?q=${'x'.repeat(MAX_RETURN_TO_CHARS - 8)}`;
    expect(q.length).toBe(MAX_RETURN_TO_CHARS);
    expect(boundReturnTo(q, '/app')).toBe(q);
    expect(boundReturnTo(`${q}y`, '/app')).toBe('/page');
    expect(boundReturnTo(`/${'p'.repeat(MAX_RETURN_TO_CHARS)}?q=1`, '/app')).toBe('/app');
    expect(boundReturnTo(`/${'p'.repeat(2047)}`, '/')).toBe('/');
  });
});

describe('oidc headers and cookies', () => {
  it('strips every client-sent ngrok-auth-* header in any case', () => {
    const h = ['Host', 'h', 'Ngrok-Auth-User-Email', 'evil@x', 'ngrok-auth-user-id', '1', 'NGROK-AUTH-EMAIL', 'e', 'x-keep', 'y'];
    stripIdentityHeaders(h);
    expect(h).toEqual(['Host', 'h', 'x-keep', 'y']);
  });
  it('strips the underscore spellings too (CGI-style servers read them as the same header)', () => {
    const h = ['ngrok_auth_user_email', 'evil@x', 'Ngrok_Auth-User-Id', '1', 'x_keep', 'y'];
    stripIdentityHeaders(h);
    expect(h).toEqual(['x_keep', 'y']);
  });
  it('makes claims safe header values', () => {
    expect(headerValue('Ann')).toBe('Ann');
    expect(headerValue('a\r\nb')).toBe('ab');
    expect(Buffer.from(headerValue('Zoë'), 'latin1').toString('utf8')).toBe('Zoë');
  });
  it('finds, removes and sets cookies', () => {
    const h = 'a=1; warren.oidc=v1.xyz; warren.oidc.login.abc=q; b=2';
    expect(getCookie(h, 'warren.oidc')).toBe('v1.xyz');
    expect(getCookie(h, 'warren.oid')).toBeUndefined();
    expect(getCookie(undefined, 'a')).toBeUndefined();
    expect(withoutCookies(h, (n) => n === 'warren.oidc' || n.startsWith('warren.oidc.login.'))).toBe('a=1; b=2');
    expect(withoutCookies('warren.oidc=x', (n) => n === 'warren.oidc')).toBeNull();
    expect(setCookie('n', 'v', { path: '/', maxAge: 60, secure: true })).toBe('n=v; Path=/; Max-Age=60; HttpOnly; SameSite=Lax; Secure');
    expect(setCookie('n', '', { path: '/', maxAge: -5, secure: false })).toBe('n=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax');
  });
  it('names the session cookie __Host-… on https (Secure, Path=/, no Domain) and plainly on http', () => {
    expect(sessionCookieName('warren.', 'oidc', 'https')).toBe('__Host-warren.oidc');
    expect(sessionCookieName('warren.', 'oauth', 'http')).toBe('warren.oauth');
    const c = setCookie(sessionCookieName('x.', 'saml', 'https'), 'v', { path: '/', maxAge: 60, secure: true });
    expect(c).toMatch(/^__Host-x\.saml=v; Path=\/; .*; Secure$/);
    expect(c).not.toMatch(/domain=/i);
  });
  it('adds a Set-Cookie to an answer: a string, then an array of separate values', () => {
    const one = addSetCookie({ status: 400, headers: { 'content-type': 'text/html' } }, 'a=; Max-Age=0');
    expect(one.headers).toEqual({ 'content-type': 'text/html', 'set-cookie': 'a=; Max-Age=0' });
    const two = addSetCookie({ status: 302, headers: { 'Set-Cookie': 's=1' } }, 'a=; Max-Age=0');
    expect(two.headers).toEqual({ 'Set-Cookie': ['s=1', 'a=; Max-Age=0'] });
    expect(addSetCookie({ status: 200 }, 'b=2').headers).toEqual({ 'set-cookie': 'b=2' });
  });
});
