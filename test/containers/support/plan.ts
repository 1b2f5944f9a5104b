/**
 * Which container projects a test run has, decided when vitest loads its
 * config (see engine.ts for CONTAINER_TESTS):
 *
 * - `containers` (test/containers/): always there; its tests skip with the
 *   reason when no engine answers and containers are not required.
 * - one project per server image, running the suite's server tests against
 *   it: there when an engine answers and the image exists or this machine can
 *   build it.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { containerTestsMode, findEngine } from './engine.js';
import { cannotBuildReason, imageExists, SERVER_IMAGES, serverImageReference } from './images.js';

const TEST_DIR = path.resolve(import.meta.dirname, '../..');

export interface ServerSuite {
  /** The project's name: the server image's, e.g. `redis-8.0`. */
  name: string;
  /** Its REDIS_TEST_IMAGE. */
  image: string;
}

export interface ContainerPlan {
  servers: ServerSuite[];
  /** One line for the run's output: what runs, and why anything does not. */
  summary: string;
}

/**
 * Decided once per vitest process (it loads its config for each project), and
 * said once.
 */
export function containerPlan(): Promise<ContainerPlan> {
  const memo = globalThis as { containerPlan?: Promise<ContainerPlan> };
  return (memo.containerPlan ??= decide().then((plan) => {
    console.log(plan.summary);
    return plan;
  }));
}

async function decide(): Promise<ContainerPlan> {
  const mode = containerTestsMode();
  if (mode === 'off') return { servers: [], summary: 'container tests: off (CONTAINER_TESTS=off)' };
  const found = await findEngine();
  if (!found.engine) {
    const verdict = mode === 'required' ? 'REQUIRED but there is no engine' : 'skipped';
    return { servers: [], summary: `container tests: ${verdict}: ${found.reason}` };
  }
  const all = SERVER_IMAGES.map((spec) => ({ name: spec.name, image: serverImageReference(spec) }));
  const reason = mode === 'required' ? undefined : await cannotBuildReason();
  const servers: ServerSuite[] = [];
  const missing: string[] = [];
  for (const suite of all) {
    if (!reason || (await imageExists(suite.image))) servers.push(suite);
    else missing.push(suite.name);
  }
  const notRun = missing.length ? `; not run against ${missing.join(', ')}: ${reason}` : '';
  const against = servers.length ? `; the server tests also run against ${servers.map((s) => s.name).join(', ')}` : '';
  return { servers, summary: `container tests: ${found.engine.description}${against}${notRun}` };
}

/**
 * The suite's server tests: the test files that start a Redis (they import one
 * of the server helpers of test/support/, or the integrity stress's targets,
 * test/stress/setups.ts). Against a server image they run
 * with REDIS_TEST_IMAGE set, which makes every server they start a container.
 */
export function serverTestFiles(): string[] {
  const starts = /from '(?:\.\.?\/)+(?:(?:support\/)?(?:redis|redis-and-proxy|cluster|sentinel)|stress\/setups)\.js'/;
  return walk(TEST_DIR)
    .filter((file) => file.endsWith('.test.ts') && !file.startsWith(path.join(TEST_DIR, 'containers')))
    .filter((file) => starts.test(readFileSync(file, 'utf8')))
    .map((file) => path.relative(path.dirname(TEST_DIR), file))
    .sort();
}

function walk(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const file = path.join(dir, name);
    return statSync(file).isDirectory() ? walk(file) : [file];
  });
}
