/**
 * vitest globalSetup of the container projects: before any test, finds the
 * engine and finds or builds the images the project needs, so that image
 * builds never eat into a test's timeout. Tests learn the outcome through
 * `inject('containers')`.
 */
import type { TestProject } from 'vitest/node';
import { containerTestsMode, findEngine } from './engine.js';
import { CannotBuildHere, proxyImage, SERVER_IMAGES, serverImage, serverImageSpec } from './images.js';

/** The project that builds and runs the proxy's image (its tests are test/containers/). */
export const IMAGE_PROJECT = 'containers';
/** The server image the image, Kubernetes and Compose tests run Redis from. */
export const SERVER_FOR_IMAGE_TESTS = 'redis-8.0';

export interface ContainerSetup {
  /** Why the container tests do not run; undefined when they do. */
  skip?: string;
  /** `podman 4.3.1`. */
  engine?: string;
}

declare module 'vitest' {
  export interface ProvidedContext {
    containers: ContainerSetup;
  }
}

export default async function setup(project: TestProject): Promise<void> {
  const mode = containerTestsMode();
  if (mode === 'off') return project.provide('containers', { skip: 'CONTAINER_TESTS=off' });
  const found = await findEngine();
  if (!found.engine) {
    // Required: the tests run, and fail with the reason.
    return project.provide('containers', mode === 'required' ? { engine: `none (${found.reason})` } : { skip: found.reason });
  }
  project.provide('containers', { engine: found.engine.description });
  try {
    if (project.name === IMAGE_PROJECT) {
      // Every image at once (mmdebstrap mostly waits on the mirror); the server projects' setups find them.
      await Promise.all([proxyImage(), ...SERVER_IMAGES.map(serverImage)]);
    } else {
      await serverImage(serverImageSpec(project.name));
    }
  } catch (err) {
    // A machine that cannot build what it lacks skips, unless containers are required.
    if (!(err instanceof CannotBuildHere) || mode === 'required') throw err;
    project.provide('containers', { skip: err.message });
  }
}
