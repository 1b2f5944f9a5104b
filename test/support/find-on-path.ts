/** Where a command is found on the PATH, as a shell finds it: the first executable file of that name. */
import { accessSync, constants as fsConstants } from 'node:fs';
import path from 'node:path';

export function findOnPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, name);
    try {
      accessSync(candidate, fsConstants.X_OK);
      return candidate;
    } catch {
      // not here; keep looking
    }
  }
  return undefined;
}
