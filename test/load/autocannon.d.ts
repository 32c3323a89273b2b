// Minimal types for the parts of autocannon 9 the API bench uses (the package ships none).
declare module 'autocannon' {
  export interface Histogram {
    min: number;
    max: number;
    average: number;
    stddev: number;
    p50: number;
    p90: number;
    p97_5: number;
    p99: number;
    p99_9: number;
    [k: string]: number;
  }
  export interface RawRequest {
    method?: string;
    path?: string;
    headers?: Record<string, string>;
    body?: string | Buffer;
  }
  export interface Options {
    url: string;
    connections?: number;
    duration?: number;
    amount?: number;
    method?: string;
    headers?: Record<string, string>;
    body?: string;
    timeout?: number;
    pipelining?: number;
    overallRate?: number;
    title?: string;
    excludeErrorStats?: boolean;
    requests?: { method?: string; path?: string; body?: string; headers?: Record<string, string>; setupRequest?: (req: RawRequest, ctx: Record<string, unknown>) => RawRequest }[];
  }
  export interface Result {
    title?: string;
    url: string;
    requests: Histogram & { total: number; sent: number };
    latency: Histogram;
    throughput: Histogram;
    duration: number;
    errors: number;
    timeouts: number;
    non2xx: number;
    statusCodeStats: Record<string, { count: number }>;
    '1xx': number;
    '2xx': number;
    '3xx': number;
    '4xx': number;
    '5xx': number;
  }
  function autocannon(opts: Options): Promise<Result>;
  export default autocannon;
}
