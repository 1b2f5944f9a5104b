/**
 * Whether this run has a container engine, said in one test: it passes with the engine's name,
 * is skipped with the reason when there is none (and containers are not required), and fails
 * with the reason when CONTAINER_TESTS=required.
 */
import { expect, inject, it } from 'vitest';

const setup = inject('containers');

it(`a container engine runs the container tests${setup.engine ? ` (${setup.engine})` : ''}`, (ctx) => {
  if (setup.skip !== undefined) ctx.skip(setup.skip);
  expect(setup.engine, 'CONTAINER_TESTS=required').toMatch(/^(podman|docker) /);
});
