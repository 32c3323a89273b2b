import type http from 'node:http';
import type { Transform } from 'node:stream';
import type { DataPlaneConfig, DpEdge, DpRoute } from '@warren/shared';
import type { Outcome, RequestState, ResponseState, RouteStage, StageDeps, StageFactory, UpstreamResult } from './types.js';

/** Largest request body buffered for a stage that needs it (webhook verification); over it, 413. */
export const MAX_BUFFERED_BODY = 1024 * 1024;

/** What a route's pipeline did to a response head. */
export interface ResponseDecision {
  status: number;
  headers: string[];
  transforms: Transform[];
}

/**
 * The stages of one route, compiled once per config version. A route without any configured
 * module or policy has no pipeline at all (null), so its requests pay nothing for this.
 */
export class RoutePipeline {
  readonly needsBody: boolean;
  private readonly requestStages: RouteStage[];
  private readonly responseStages: RouteStage[];
  private readonly transformStages: RouteStage[];
  private readonly resultStages: RouteStage[];

  constructor(readonly stages: RouteStage[]) {
    this.needsBody = stages.some((s) => s.needsBody);
    this.requestStages = stages.filter((s) => s.onRequest);
    // Responses pass the stages in reverse: the stage nearest the upstream sees it first.
    this.responseStages = stages.filter((s) => s.onResponse).reverse();
    this.transformStages = stages.filter((s) => s.transformBody).reverse();
    this.resultStages = stages.filter((s) => s.onResult);
  }

  get hasResponseStages(): boolean {
    return this.responseStages.length > 0 || this.transformStages.length > 0 || this.resultStages.length > 0;
  }

  /**
   * Some stage edits, replaces or transforms responses (`onResponse` / `transformBody`: the
   * traffic policy's outbound rules, response_headers, compression, a sign-in's session refresh).
   * A request stage's own answer then goes through {@link onResponse} as the upstream's response
   * would (`http/proxy.ts` `deliverAnswer`); without such a stage it is sent as it is, at no cost.
   */
  get editsResponses(): boolean {
    return this.responseStages.length > 0 || this.transformStages.length > 0;
  }

  /** Some stage listens for upstream results (a circuit breaker). */
  get hasResultStages(): boolean {
    return this.resultStages.length > 0;
  }

  /**
   * Runs the request stages in order; the first Outcome ends the request there. Synchronous
   * until a stage answers with a promise (a rate-limit check): no promise per request otherwise.
   * A request a stage answers, or whose stages fail, has no upstream result: the result stages
   * are told `'none'` (a circuit breaker's half-open probe frees its place).
   */
  onRequest(s: RequestState, from = 0): Outcome | Promise<Outcome> {
    const stages = this.requestStages;
    try {
      for (let i = from; i < stages.length; i++) {
        const out = stages[i]!.onRequest!(s);
        if (out instanceof Promise) {
          if (i + 1 < stages.length) return out.then((o) => (o ? this.answered(s, o) : this.onRequest(s, i + 1)), (err: unknown) => this.failed(s, err));
          return this.resultStages.length === 0 ? out : out.then((o) => (o ? this.answered(s, o) : o), (err: unknown) => this.failed(s, err));
        }
        if (out) return this.answered(s, out);
      }
    } catch (err) {
      this.failed(s, err);
    }
    return null;
  }

  private answered(s: RequestState, out: NonNullable<Outcome>): NonNullable<Outcome> {
    if (this.resultStages.length > 0) this.onResult(s, 'none');
    return out;
  }

  private failed(s: RequestState, err: unknown): never {
    if (this.resultStages.length > 0) this.onResult(s, 'none');
    throw err;
  }

  /**
   * Runs the response stages on the head; an Outcome replaces the response. The head is the
   * upstream's, or a request stage's own answer (see {@link editsResponses}); either way an
   * Outcome here is final: it is sent as it is, never through the stages again.
   */
  async onResponse(s: RequestState, status: number, headers: string[]): Promise<ResponseDecision | Outcome> {
    const r: ResponseState = { status, headers };
    for (const stage of this.responseStages) {
      const out = await stage.onResponse!(s, r);
      if (out) return out;
    }
    const transforms: Transform[] = [];
    for (const stage of this.transformStages) {
      const t = stage.transformBody!(s, r);
      if (t) transforms.push(t);
    }
    return { status: r.status, headers: r.headers, transforms };
  }

  onResult(s: RequestState, result: UpstreamResult): void {
    for (const stage of this.resultStages) stage.onResult!(s, result);
  }
}

export function isOutcome(x: ResponseDecision | Outcome): x is Exclude<Outcome, null> {
  return x !== null && !('transforms' in x);
}

/** Compiles a route's stages from the factories, in their order; null when none applies. */
export type PipelineCompiler = (route: DpRoute, edge: DpEdge, config: DataPlaneConfig) => RoutePipeline | null;

export function createPipelineCompiler(factories: StageFactory[], deps: StageDeps): PipelineCompiler {
  return (route, edge, config) => {
    const stages: RouteStage[] = [];
    for (const f of factories) {
      const stage = f(route, edge, config, deps);
      if (stage) stages.push(stage);
    }
    return stages.length > 0 ? new RoutePipeline(stages) : null;
  };
}

/**
 * Longest wait for a buffered request body, from when its reading starts; then `readBody` gives
 * up ('timeout', the caller answers 408). The public servers have no request timeout, so without
 * it a client sending a body slowly (or never) would hold its buffer, up to 1 MiB, for as long
 * as it keeps the connection open.
 */
export const BODY_READ_TIMEOUT_MS = 30_000;

/**
 * The bytes of request bodies a process holds for its route pipelines at once. Each body is held
 * to 1 MiB and 30 s, but without a sum 600 clients each sending 1 MiB less one byte held 600 MB
 * for 30 s, and could again at once. A body is counted as it arrives and until its request's
 * response has closed (the caller releases it).
 */
export class BodyBudget {
  private heldBytes = 0;

  constructor(readonly limit: number) {}

  get held(): number {
    return this.heldBytes;
  }

  /** Takes `n` bytes if they fit. */
  take(n: number): boolean {
    if (this.heldBytes + n > this.limit) return false;
    this.heldBytes += n;
    return true;
  }

  release(n: number): void {
    this.heldBytes = Math.max(0, this.heldBytes - n);
  }
}

/**
 * Reads a request body up to `limit` bytes within `timeoutMs`; resolves null when it is larger
 * (the caller answers 413), 'timeout' when it did not arrive in time (408), 'busy' when `budget`
 * cannot hold it (503; a declared Content-Length is checked before reading). On success the
 * body's bytes stay taken from `budget`: the caller releases them when the request is done.
 */
export function readBody(req: http.IncomingMessage, limit = MAX_BUFFERED_BODY, timeoutMs = BODY_READ_TIMEOUT_MS, budget?: BodyBudget): Promise<Buffer | null | 'timeout' | 'busy'> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length'] ?? 0);
    if (declared > limit) {
      resolve(null);
      return;
    }
    if (budget && declared > 0 && budget.held + declared > budget.limit) {
      resolve('busy');
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let over = false;
    const stop = (v: null | 'timeout' | 'busy') => {
      over = true;
      chunks.length = 0;
      clearTimeout(timer);
      budget?.release(size);
      resolve(v);
    };
    const timer = setTimeout(() => stop('timeout'), timeoutMs);
    req.on('data', (c: Buffer) => {
      if (over) return;
      if (size + c.length > limit) return stop(null);
      if (budget && !budget.take(c.length)) return stop('busy');
      size += c.length;
      chunks.push(c);
    });
    req.on('end', () => {
      clearTimeout(timer);
      if (over) return;
      over = true; // the bytes are the caller's to release now
      resolve(Buffer.concat(chunks, size));
    });
    req.on('error', (err) => {
      if (over) return;
      over = true;
      clearTimeout(timer);
      budget?.release(size);
      reject(err);
    });
  });
}
