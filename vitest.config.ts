import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Generous: tests start real redis-server processes (or containers).
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Forks, not threads: each file owns child processes and sockets, and a
    // crashed fork cannot take the others down with it.
    pool: 'forks',
    fileParallelism: true,
    // At most two test files at once keeps CI machines from being swamped by
    // parallel redis-servers while still overlapping slow files.
    maxWorkers: 2,
    minWorkers: 1,
    watch: false,
  },
});
