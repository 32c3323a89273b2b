import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['services/*/src/**/*.test.ts', 'test/**/*.test.ts'],
    exclude: ['**/node_modules/**', 'test/load/**'],
    globalSetup: ['test/support/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // Two cores: a few files at once keeps Postgres busy without starving it.
    maxWorkers: 3,
  },
});
