import { createHash } from 'node:crypto';
import { Counter, type Registry } from 'prom-client';
import type { Logger } from 'pino';
import { headerValues, isValidHostValue, type PolicyDirection } from '@warren/shared';
import type { Transform } from 'node:stream';
import type { Outcome, RateLimiter, RateLimitResult, RequestState, ResponseState, RouteStage, UpstreamResult } from '../pipeline/types.js';
import { noContentStatus } from '../http/answer.js';
import { Activation, actionsOf } from './activation.js';
import { basicAuth, restrictIps } from './access-actions.js';
import { runLog, runSetVars } from './var-actions.js';
import { runRedirect, runUrlRewrite } from './url-actions.js';
import { jwtReadsBody, observeJwks, runJwtValidation } from './jwt-action.js';
import { compressTransform, hasActionKind, runCompressResponse, runVerifyWebhook } from './body-actions.js';
import { CLOSE_CONNECTION, hasCircuitBreaker, recordCircuitBreakers, runCircuitBreaker } from './flow-actions.js';
import { runAuthAction } from './auth-actions.js';
import { findReplaceTransform, observeFindReplace, runRequestFindReplace, runResponseFindReplace } from './find-replace.js';
import type { CompiledAddHeaders, CompiledPolicy, CompiledRateLimit, CompiledRespond, CompiledRule } from './compile.js';
import { runForwardInternal, type InternalEndpointLookup } from './forward-internal.js';
import { addWithinHead, celToHeaderText, interpolateHeader, overHeadError, withoutHeaders, type HeaderValue } from './headers.js';

/** Keys longer than this are hashed (the bucket values may hold long headers). */
const MAX_PLAIN_KEY = 256;

const RATE_LIMITED_BODY = 'Too Many Requests: rate limit exceeded\n';

/** Longest interpolated custom-response body, in characters (the literal text is at most 64 KiB). */
const MAX_RESPONSE_BODY = 256 * 1024;

export interface EngineDeps {
  limiter: RateLimiter;
  log: Logger;
  registry: Registry;
  /** forward-internal: whether an account has an internal endpoint of that hostname online. */
  internalEndpoint?: InternalEndpointLookup;
}

function errorCounter(registry: Registry): Counter<'direction'> {
  const name = 'warren_traffic_policy_expression_errors_total';
  const existing = registry.getSingleMetric(name);
  if (existing) return existing as Counter<'direction'>;
  return new Counter({
    name,
    help: 'Traffic policy expressions or header interpolations that failed to evaluate (the rule did not apply, or applied if it has a deny action / the header was not set)',
    labelNames: ['direction'],
    registers: [registry],
  });
}

/** One direction's rules run against one request or response. */
interface Run {
  act: Activation;
  rules: CompiledRule[];
  /**
   * Whose headers the actions edit: the request's (inbound) or the response's (outbound). (An
   * object, not a getter/setter pair: two closures fewer per request on the hot path.)
   */
  edited: { headers: string[] };
}

function hasContentType(headers: Record<string, string>): boolean {
  for (const name in headers) if (name.length === 12 && name.toLowerCase() === 'content-type') return true;
  return false;
}

/** HTML's opening tags that Go's `http.DetectContentType` recognises (followed by a space or `>`). */
const HTML_START_RE = /^(?:<!doctype html|<html|<head|<script|<iframe|<h1|<div|<font|<table|<a|<style|<title|<b|<body|<br|<p|<!--)[ >]/i;

/**
 * The Content-Type of a custom-response body given none: JSON (an object or array that parses)
 * `application/json`; HTML by Go's `http.DetectContentType` signatures (ngrok's agent and edge
 * are Go) `text/html; charset=utf-8`; `<?xml` `text/xml; charset=utf-8`; anything else
 * `text/plain; charset=utf-8` (the body is a string of text). Leading white space is skipped.
 */
export function inferContentType(body: string): string {
  let i = 0;
  while (i < body.length && (body.charCodeAt(i) <= 0x20)) i++;
  const c = body.charCodeAt(i);
  if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
    try {
      JSON.parse(body);
      return 'application/json';
    } catch {
      return 'text/plain; charset=utf-8';
    }
  }
  if (c === 0x3c /* < */) {
    const head = body.slice(i, i + 16);
    if (HTML_START_RE.test(head)) return 'text/html; charset=utf-8';
    if (head.startsWith('<?xml')) return 'text/xml; charset=utf-8';
  }
  return 'text/plain; charset=utf-8';
}

/**
 * The `traffic_policy` stage: inbound rules on the request, outbound rules on the response head.
 * Rules run in order; a rule applies when all its expressions are true; its actions run in
 * order. An expression that fails to evaluate (an error, or not a bool) skips its rule, except
 * in a rule with a deny action, where it counts as true (`CompiledRule.failClosed`): a deny that
 * cannot be decided denies. Runs synchronously until a rate-limit action has to ask the limiter.
 */
export class TrafficPolicyStage implements RouteStage {
  readonly name = 'traffic_policy';
  readonly onRequest?: (s: RequestState) => Outcome | Promise<Outcome>;
  readonly onResponse?: (s: RequestState, r: ResponseState) => Outcome | Promise<Outcome>;
  /** Declared only by a policy with a verify-webhook or request-body-find-replace action or a jwt-validation body token (the runner then buffers the body). */
  readonly needsBody?: boolean;
  /** Declared only by a policy with a compress-response or response-body-find-replace action (`body-actions.ts`, `find-replace.ts`). */
  readonly transformBody?: (s: RequestState, r: ResponseState) => Transform | null;
  /** Declared only by a policy with a circuit-breaker action that can trip (`flow-actions.ts`). */
  readonly onResult?: (s: RequestState, result: UpstreamResult) => void;
  private readonly errors: Counter<'direction'>;
  /** Expression locations already logged: each failing one is logged once per policy. */
  private readonly logged = new Set<string>();

  constructor(
    private readonly policy: CompiledPolicy,
    private readonly routeId: string,
    private readonly deps: EngineDeps,
  ) {
    this.errors = errorCounter(deps.registry);
    if (policy.inbound.length > 0) this.onRequest = (s) => this.runRequest(s);
    if (policy.outbound.length > 0 || policy.auth) {
      // oauth / openid-connect: a sliding session's refreshed cookie goes on the upstream's response.
      const auth = policy.auth;
      this.onResponse = auth ? (s, r) => (auth.onResponse(s, r), this.runResponse(s, r)) : (s, r) => this.runResponse(s, r);
    }
    const requestFindReplace = hasActionKind(policy.inbound, 'request-body-find-replace');
    if (hasActionKind(policy.inbound, 'verify-webhook') || jwtReadsBody(policy.inbound) || requestFindReplace) this.needsBody = true;
    if (hasActionKind(policy.inbound, 'jwt-validation')) observeJwks(policy.inbound, deps.registry, deps.log);
    const responseFindReplace = hasActionKind(policy.outbound, 'response-body-find-replace');
    if (requestFindReplace || responseFindReplace) observeFindReplace(deps.registry);
    if (responseFindReplace) {
      // Replace first, then compress (a compress-response's compressor is chained after the rewrite).
      const compress = hasActionKind(policy.outbound, 'compress-response');
      this.transformBody = (s, r) => findReplaceTransform(s, r, compress ? compressTransform(s, r) : null, (err) => this.failedIn('outbound', 'response-body-find-replace', err));
    } else if (hasActionKind(policy.outbound, 'compress-response')) this.transformBody = compressTransform;
    if (hasCircuitBreaker(policy.inbound)) this.onResult = (s, result) => recordCircuitBreakers(s, result, deps.log);
  }

  private runRequest(s: RequestState): Outcome | Promise<Outcome> {
    // oauth / openid-connect special paths (`<prefix>/ngrok/{login,logout,callback}`) are answered before any rule.
    const special = this.policy.auth?.specialPath(s);
    if (special) return special;
    const run: Run = { act: new Activation(s, null), rules: this.policy.inbound, edited: s };
    return this.runFrom(run, 0, 0);
  }

  private runResponse(s: RequestState, r: ResponseState): Outcome | Promise<Outcome> {
    const run: Run = { act: new Activation(s, r), rules: this.policy.outbound, edited: r };
    return this.runFrom(run, 0, 0);
  }

  /** Runs from rule `i`, action `j` (j > 0: that rule already matched). */
  private runFrom(run: Run, i: number, j: number): Outcome | Promise<Outcome> {
    const { rules } = run;
    for (; i < rules.length; i++, j = 0) {
      const rule = rules[i]!;
      if (j === 0 && !this.matches(run, rule)) continue;
      const actions = rule.actions;
      for (; j < actions.length; j++) {
        const a = actions[j]!;
        switch (a.kind) {
          case 'rate-limit':
            return this.rateLimit(run, a, i, j);
          case 'respond':
            return this.respond(run, a);
          case 'add-headers':
            this.addHeaders(run, a);
            break;
          case 'remove-headers': {
            const before = run.edited.headers;
            const after = withoutHeaders(before, a.lower);
            if (after !== before) {
              run.edited.headers = after;
              run.act.headersChanged();
            }
            break;
          }
          case 'restrict-ips': {
            // Either phase: the client's address is the request's. In the response phase a refusal
            // replaces the upstream's response (its body is dropped), as a custom-response there does.
            const out = restrictIps(a, run.act.s);
            if (out) return out;
            break;
          }
          case 'basic-auth': {
            const out = basicAuth(a, run.act.s);
            if (out) return out;
            break;
          }
          case 'set-vars':
            runSetVars(run.act, a, (where, err) => this.failed(run, where, err));
            break;
          case 'log':
            runLog(run.act, a, (where, err) => this.failed(run, where, err));
            break;
          case 'url-rewrite':
            runUrlRewrite(run.act, a, (where, err) => this.failed(run, where, err));
            break;
          case 'jwt-validation': {
            // Inbound only (validated). Asynchronous once a token is found: the rules then go on after it.
            const out = runJwtValidation(a, run.act.s);
            if (out instanceof Promise) return out.then((o) => o ?? this.runFrom(run, i, j + 1));
            if (out) return out;
            break;
          }
          case 'verify-webhook': {
            // Inbound only (validated). Asynchronous for SNS only: then the rules go on after it.
            const out = runVerifyWebhook(a, run.act.s);
            if (out instanceof Promise) return out.then((o) => o ?? this.runFrom(run, i, j + 1));
            if (out) return out;
            break;
          }
          case 'compress-response':
            // Outbound only (validated): `run.act.r` is the response head.
            runCompressResponse(a, run.act.s, run.act.r!);
            run.act.headersChanged();
            break;
          case 'redirect': {
            const out = runRedirect(run.act, a, (where, err) => this.failed(run, where, err));
            if (out) return out;
            break;
          }
          case 'circuit-breaker': {
            // Inbound only (validated): `run.act.s` is the request.
            const out = runCircuitBreaker(a, run.act.s);
            if (out) return out;
            break;
          }
          case 'close-connection':
            return CLOSE_CONNECTION;
          case 'forward-internal': {
            // Inbound only (validated): the request goes to an internal endpoint, or (on_error: continue) the rules go on.
            const out = runForwardInternal(run.act, a, this.deps.internalEndpoint, (where, err) => this.failed(run, where, err));
            if (out) return out;
            break;
          }
          case 'oauth':
          case 'openid-connect': {
            // Inbound only (validated): terminating (302 / 401) without a session, else the rules go on.
            const out = runAuthAction(a, run.act);
            if (out) return out;
            break;
          }
          case 'request-body-find-replace': {
            // Inbound only (validated): the body is buffered (`needsBody`). Asynchronous for an encoded body: then the rules go on after it.
            const out = runRequestFindReplace(run.act, a, (where, err) => this.failed(run, where, err));
            if (out instanceof Promise) return out.then(() => this.runFrom(run, i, j + 1));
            break;
          }
          case 'response-body-find-replace':
            // Outbound only (validated): decides on the head; `transformBody` rewrites the body.
            runResponseFindReplace(run.act, a, (where, err) => this.failed(run, where, err));
            break;
        }
      }
    }
    return null;
  }

  /**
   * All the rule's expressions are true. One that fails to evaluate (counted and logged) skips the
   * rule, unless the rule fails closed (it has a deny action): then it counts as true, so the
   * rule's other expressions still decide whatever their order (a false one elsewhere keeps the
   * rule from applying).
   */
  private matches(run: Run, rule: CompiledRule): boolean {
    for (const c of rule.conditions) {
      let v: unknown;
      try {
        v = c.program(run.act);
      } catch (err) {
        this.failed(run, c.where, err, rule.failClosed);
        if (!rule.failClosed) return false;
        continue; // counts as true: a later false expression still decides
      }
      if (v !== true) {
        if (typeof v !== 'boolean') {
          this.failed(run, c.where, new Error(`evaluated to ${typeof v}, not a bool`), rule.failClosed);
          if (!rule.failClosed) return false;
          continue;
        }
        return false;
      }
    }
    return true;
  }

  /** `failClosed`: an expression of a rule with a deny action failed, so the rule applies (the log says so). */
  private failed(run: Run, where: string, err: unknown, failClosed = false): void {
    this.failedIn(run.act.r ? 'outbound' : 'inbound', where, err, failClosed);
  }

  private failedIn(direction: PolicyDirection, where: string, err: unknown, failClosed = false): void {
    this.errors.inc({ direction });
    if (this.logged.has(where) || this.logged.size > 1000) return;
    this.logged.add(where);
    const msg = valueFreeMessage(err instanceof Error ? ((err as { summary?: string }).summary ?? err.message.split('\n')[0]!) : String(err));
    this.deps.log.warn(
      { routeId: this.routeId, where, err: msg },
      failClosed
        ? 'traffic policy: evaluation failed; the rule has a deny action, so it applies (fails closed); logged once per policy'
        : 'traffic policy: evaluation failed (rule skipped / header not set); logged once per policy',
    );
  }

  /**
   * Appends the headers after any of the same name (ngrok's add-headers: "If the header already
   * exists it will append another header with the same key unless it is the host header"); a
   * request's Host is replaced instead (`replace`), and only once its new value is known, so a
   * failed interpolation leaves the client's Host rather than none. So does a Host value that is
   * not `host[:port]` (`isValidHostValue`; `[oops`, or a client's `[` interpolated): it is counted
   * and logged as a failed interpolation, never handed to undici (which asserts on it: a 502).
   */
  private addHeaders(run: Run, a: CompiledAddHeaders): void {
    let out = run.edited.headers.slice();
    const added: string[] | undefined = a.record ? [] : undefined;
    for (const h of a.headers) {
      const where = `add-headers ${h.name}`;
      const value = this.interpolate(run, h.value, where);
      if (value === null) continue;
      if (a.replace.has(h.lower)) {
        if (h.lower === 'host' && !isValidHostValue(value)) {
          this.failed(run, where, new Error(`the Host value ${JSON.stringify(value.slice(0, 64))} is not host[:port]; the client's Host is kept`));
          continue;
        }
        out = withoutHeaders(out, a.replace);
      }
      out.push(h.name, value);
      added?.push(h.name, value);
    }
    run.edited.headers = out;
    run.act.headersChanged();
    // `actions.ngrok.add_headers.headers_added` (only for a policy that reads it; see `CompiledAddHeaders.record`).
    if (added) actionsOf(run.act.s).ngrok.add_headers.record(added);
  }

  /** A header value as it is sent (`interpolateHeader`); null (counted and logged at `where`) when a `${…}` fails or the result cannot be sent. */
  private interpolate(run: Run, value: HeaderValue, where: string): string | null {
    try {
      return interpolateHeader(value, (p) => p(run.act));
    } catch (err) {
      this.failed(run, where, err);
      return null;
    }
  }

  /**
   * deny, custom-response. custom-response's body and header values may interpolate, as
   * add-headers' do: a header whose `${…}` fails is left out, a body part that fails is left
   * empty (counted and logged either way), and the body stops growing at `MAX_RESPONSE_BODY`.
   */
  private respond(run: Run, a: CompiledRespond): Outcome {
    const headers: Record<string, string> = {};
    let used = 0;
    for (const h of a.headers ?? []) {
      const value = this.interpolate(run, h.value, `${a.where} headers.${h.name}`);
      if (value === null) continue;
      const after = addWithinHead(headers, h.name, value, used);
      if (after < 0) this.failed(run, `${a.where} headers.${h.name}`, overHeadError(h.name));
      else used = after;
    }
    let body = '';
    if (typeof a.body === 'string') body = a.body;
    else if (a.body) {
      for (const p of a.body) {
        let part: string;
        try {
          part = typeof p === 'string' ? p : celToHeaderText(p(run.act));
        } catch (err) {
          this.failed(run, `${a.where} body`, err);
          continue;
        }
        if (body.length + part.length > MAX_RESPONSE_BODY) {
          this.failed(run, `${a.where} body`, new Error(`the interpolated body is over ${MAX_RESPONSE_BODY} characters: the rest is left out`));
          break;
        }
        body += part;
      }
    }
    // custom-response without a Content-Type: infer one, as ngrok does, rather than leave the
    // body to a browser's sniffing (a body that echoes request data could be read as HTML).
    if (a.body !== undefined && body !== '' && !noContentStatus(a.status) && !hasContentType(headers)) headers['Content-Type'] = inferContentType(body);
    return { status: a.status, headers, body };
  }

  /** Asks the limiter; then a 429, or the rules go on after action `j` of rule `i`. */
  private rateLimit(run: Run, a: CompiledRateLimit, i: number, j: number): Promise<Outcome> {
    // A header straight from the request's pairs as they stand (names lowercased at parse): the
    // same values `req.headers` shows, without building the CEL request view for it.
    const values = a.bucketKey.map((k) => (k.kind === 'host' ? run.act.s.host : k.kind === 'client_ip' ? run.act.s.clientIp : headerValues(run.act.s.headers, k.name).join(', ')));
    const shown = JSON.stringify(values);
    const key = a.prefix.length + shown.length <= MAX_PLAIN_KEY ? a.prefix + shown : `${a.prefix}#${createHash('sha256').update(shown).digest('base64url')}`;
    const vars = actionsOf(run.act.s).ngrok.rate_limit;
    vars.bucket_key = shown;
    let hit: Promise<RateLimitResult>;
    try {
      hit = this.deps.limiter.hit(key, a.capacity, a.rateSeconds);
    } catch (err) {
      hit = Promise.reject(err as Error);
    }
    return hit.then(
      (result) => this.afterRateLimit(run, a, vars, result, i, j),
      // The limiter is meant to fail open by itself; if it throws anyway, so do we.
      (err: unknown) => this.afterRateLimit(run, a, vars, { limited: false, retryAfterSeconds: 0, error: { code: 'rate_limiter_failed', message: err instanceof Error ? err.message : String(err) } }, i, j),
    );
  }

  private afterRateLimit(run: Run, a: CompiledRateLimit, vars: RateLimitVars, result: RateLimitResult, i: number, j: number): Outcome | Promise<Outcome> {
    vars.limited = result.limited;
    vars.error.code = result.error?.code ?? '';
    vars.error.message = result.error?.message ?? '';
    // enforce: false (ngrok's dry run) only marks the request; the limiter did not count it.
    if (result.limited && a.enforce) {
      return {
        status: 429,
        headers: { 'retry-after': String(Math.max(1, Math.ceil(result.retryAfterSeconds))), 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' },
        body: RATE_LIMITED_BODY,
      };
    }
    return j + 1 < run.rules[i]!.actions.length ? this.runFrom(run, i, j + 1) : this.runFrom(run, i + 1, 0);
  }
}

/**
 * An evaluation error's message as the log may have it: without the operand, which is request
 * data. The CEL library writes the value it was given into its messages (`bool() conversion
 * error: invalid string value "<a query parameter>"`, `No such key: <an Authorization header>`,
 * `Invalid duration string: <a header>`), and the log must not hold a client's credentials; the
 * message is kept up to its first `: ` or quote, which names the kind of error, and `where` names
 * the expression.
 */
export function valueFreeMessage(msg: string): string {
  const cut = msg.search(/: |["'`]/);
  return (cut < 0 ? msg : msg.slice(0, cut)).slice(0, 200);
}

/** The `actions.ngrok.rate_limit` variables of a request. */
type RateLimitVars = ReturnType<typeof actionsOf>['ngrok']['rate_limit'];

