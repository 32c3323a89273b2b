// Entry of the worker thread of state-store.ts, in JavaScript: it loads the worker's TypeScript
// (state-store.worker.ts) through tsx's API. The services run under `node --import tsx`, but
// Node 20 does not apply the hooks `--import` registers to worker threads; `tsImport` registers
// its own, for this import only, under any Node version.
const { tsImport } = await import('tsx/esm/api');
await tsImport('./state-store.worker.ts', import.meta.url);
