// Entry of the worker threads of user-agent-check.ts, in JavaScript: it loads the worker's
// TypeScript (user-agent-check.worker.ts) through tsx's API. The services run under
// `node --import tsx`, but Node 20 does not apply the hooks `--import` registers to worker
// threads; `tsImport` registers its own, for this import only, under any Node version.
const { tsImport } = await import('tsx/esm/api');
await tsImport('./user-agent-check.worker.ts', import.meta.url);
