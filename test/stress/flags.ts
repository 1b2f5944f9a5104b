/** The flags of `npm run stress` (its own module, so that tests can read them without starting a stress). */
export const STRESS_FLAGS = {
  seconds: { type: 'string', default: '60' },
  seed: { type: 'string' },
  clients: { type: 'string', default: '32' },
  pairs: { type: 'string' },
  'slow-share': { type: 'string', default: '0.25' },
  'max-value-mib': { type: 'string', default: '4' },
  transport: { type: 'string', default: 'tcp' },
  'lock-method': { type: 'string', default: 'auto' },
  direct: { type: 'boolean', default: false },
  'proxy-build': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;
