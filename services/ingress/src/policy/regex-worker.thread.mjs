// Entry of the regex worker thread of regex-worker.ts, in JavaScript: it loads the worker's
// TypeScript (regex-worker.thread.ts) through tsx's API. The services run under
// `node --import tsx`, but Node 20 does not apply the hooks `--import` registers to worker
// threads; `tsImport` registers its own, for this import only, under any Node version.
const { tsImport } = await import('tsx/esm/api');
await tsImport('./regex-worker.thread.ts', import.meta.url);
