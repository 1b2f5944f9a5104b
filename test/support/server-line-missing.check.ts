/**
 * The one test of a server-line project whose tree is missing while REDIS_SERVERS=required
 * (server-lines.ts): it fails, naming what is missing.
 */
import { it } from 'vitest';
import { LINE_MISSING_ENV } from './server-lines.js';

it('has the server tree this project runs against', () => {
  throw new Error(process.env[LINE_MISSING_ENV] ?? `${LINE_MISSING_ENV} is not set`);
});
