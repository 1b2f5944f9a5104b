/** A setting the operator gave is wrong; the message says which and why. Exit code 2. */
export class ConfigError extends Error {
  readonly code = 'ECONFIG';
}
