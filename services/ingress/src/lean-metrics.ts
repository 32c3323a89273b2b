import type { Metric, Registry } from 'prom-client';

/**
 * Counters and histograms for the request path: `inc`/`observe` on a child is an addition (and a
 * bucket search), where prom-client's own validate and hash the label set on every call, bound
 * children included. They are registered in a prom-client Registry as metrics whose `get()` returns
 * what prom-client's Counter/Histogram would, so the exposition (text format, default labels,
 * JSON) stays prom-client's; lean-metrics.test.ts compares the two.
 */

type Labels = Record<string, string>;

/** The children map's key for label values given in `names` order (checked to be complete). */
function childKey(metric: string, names: readonly string[], values: readonly string[]): string {
  if (values.length !== names.length) throw new TypeError(`${metric}: ${names.length} label values expected, got ${values.length}`);
  return values.join('\u0000');
}

function labelsOf(names: readonly string[], values: readonly string[]): Labels {
  const labels: Labels = {};
  names.forEach((n, i) => (labels[n] = values[i]!));
  return labels;
}

/** A counter with a fixed list of label names; a labelled child's series appears once it is incremented. */
export class LeanCounter {
  readonly type = 'counter';
  readonly aggregator = 'sum';
  private readonly children = new Map<string, { labels: Labels; value: number; seen: boolean }>();

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly labelNames: readonly string[] = [],
  ) {
    // prom-client shows a counter without labels from the start, at 0.
    if (labelNames.length === 0) this.children.set('', { labels: {}, value: 0, seen: true });
  }

  /** The child for these label values (in `labelNames` order); keep it, its `inc` is the lean part. */
  child(...values: string[]): { inc(n?: number): void } {
    const key = childKey(this.name, this.labelNames, values);
    let c = this.children.get(key);
    if (c === undefined) {
      c = { labels: labelsOf(this.labelNames, values), value: 0, seen: false };
      this.children.set(key, c);
    }
    const entry = c;
    return {
      inc(n = 1) {
        entry.value += n;
        entry.seen = true;
      },
    };
  }

  /** Drops a child's series and its memory; a child kept after this counts nowhere (drop it too). */
  remove(...values: string[]): void {
    this.children.delete(values.join('\u0000'));
  }

  async get() {
    const values: Array<{ labels: Labels; value: number }> = [];
    for (const c of this.children.values()) if (c.seen) values.push({ labels: { ...c.labels }, value: c.value });
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  /** As prom-client's reset (children kept stay valid). */
  reset(): void {
    for (const c of this.children.values()) {
      c.value = 0;
      c.seen = this.labelNames.length === 0;
    }
  }
}

interface HistogramChild {
  labels: Labels;
  /** Per-bucket counts (not cumulative); the last one is past the largest bound. */
  counts: Float64Array;
  sum: number;
  count: number;
  /** Shown: observed since the last reset (or an unlabelled one never reset). */
  seen: boolean;
}

/**
 * A histogram with a fixed list of label names. Without labels its series exist from the start,
 * with labels once a child is created, as prom-client's do.
 */
export class LeanHistogram {
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  private readonly children = new Map<string, HistogramChild>();

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly buckets: readonly number[],
    private readonly labelNames: readonly string[] = [],
  ) {
    if (labelNames.length === 0) this.child();
  }

  /** The child for these label values (in `labelNames` order); keep it, its `observe` is the lean part. */
  child(...values: string[]): { observe(v: number): void } {
    const key = childKey(this.name, this.labelNames, values);
    let c = this.children.get(key);
    if (c === undefined) {
      c = { labels: labelsOf(this.labelNames, values), counts: new Float64Array(this.buckets.length + 1), sum: 0, count: 0, seen: this.labelNames.length === 0 };
      this.children.set(key, c);
    }
    const entry = c;
    const b = this.buckets;
    return {
      observe(v: number): void {
        let i = 0;
        while (i < b.length && v > b[i]!) i++;
        entry.counts[i]!++;
        entry.sum += v;
        entry.count++;
        entry.seen = true;
      },
    };
  }

  /** Drops a child's series and its memory; a child kept after this counts nowhere (drop it too). */
  remove(...values: string[]): void {
    this.children.delete(values.join('\u0000'));
  }

  /** As prom-client's: in the text format `le` is the label and the series' own labels are shared ones. */
  async getForPromString() {
    const bucket = `${this.name}_bucket`;
    const values: Array<{ labels: Record<string, string | number>; sharedLabels: Labels; value: number; metricName: string; exemplar?: null }> = [];
    for (const c of this.children.values()) {
      if (!c.seen) continue;
      let acc = 0;
      for (let i = 0; i < this.buckets.length; i++) {
        acc += c.counts[i]!;
        values.push({ labels: { le: this.buckets[i]! }, sharedLabels: c.labels, value: acc, metricName: bucket, exemplar: null });
      }
      values.push({ labels: { le: '+Inf' }, sharedLabels: c.labels, value: c.count, metricName: bucket, exemplar: null });
      values.push({ labels: {}, sharedLabels: c.labels, value: c.sum, metricName: `${this.name}_sum` });
      values.push({ labels: {}, sharedLabels: c.labels, value: c.count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  async get() {
    const m = await this.getForPromString();
    return { ...m, values: m.values.map(({ labels, sharedLabels, ...v }) => ({ ...v, labels: { ...labels, ...sharedLabels } })) };
  }

  /** As prom-client's reset: every series gone until observed again (children kept stay valid). */
  reset(): void {
    for (const c of this.children.values()) {
      c.counts.fill(0);
      c.sum = 0;
      c.count = 0;
      c.seen = false;
    }
  }
}

/** Registers `m` in `registry`, or returns the metric already registered under its name. */
export function registerLean<T extends LeanCounter | LeanHistogram>(registry: Registry, m: T): T {
  const existing = registry.getSingleMetric(m.name) as unknown;
  if (existing !== undefined) {
    if (!(existing instanceof (m.constructor as new (...a: never[]) => T))) throw new Error(`${m.name} is already registered as another kind of metric`);
    return existing as T;
  }
  registry.registerMetric(m as unknown as Metric);
  return m;
}
