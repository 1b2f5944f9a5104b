import { defineConfig, type ViteUserConfig } from 'vitest/config';
import { IMAGE_PROJECT } from './test/containers/support/global-setup.js';
import { containerPlan, serverTestFiles } from './test/containers/support/plan.js';
import { serverLinePlan } from './test/support/server-lines.js';

// Projects: `host` is every test against local redis-server processes;
// `containers` builds and runs the proxy's image and the examples; one more
// per server image runs the server tests against it (test/containers/support/plan.ts), and one
// per server line built from source (`redis-6.0`) the version-dependent tests (test/support/server-lines.ts).
export default defineConfig(async (): Promise<ViteUserConfig> => {
  const plan = await containerPlan();
  const lines = serverLinePlan();
  // Finds the engine and finds or builds the images before any test starts.
  const globalSetup = ['test/containers/support/global-setup.ts'];
  return {
    test: {
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
      projects: [
        { extends: true, test: { name: 'host', include: ['test/**/*.test.ts'], exclude: ['test/containers/**'] } },
        {
          extends: true,
          // Containers, pods and Compose projects on a busy machine: minutes, not seconds.
          test: { name: IMAGE_PROJECT, include: ['test/containers/**/*.test.ts'], testTimeout: 180_000, hookTimeout: 300_000, globalSetup },
        },
        ...plan.servers.map((server) => ({
          extends: true as const,
          test: { name: server.name, include: serverTestFiles(), env: { REDIS_TEST_IMAGE: server.image }, globalSetup },
        })),
        ...lines.projects.map((line) => ({
          extends: true as const,
          test: { name: line.name, include: line.include, env: line.env, setupFiles: line.setupFiles },
        })),
      ],
    },
  };
});
