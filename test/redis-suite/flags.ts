/** The flags of `npm run redis-suite` (its own module, so that tests can read them without running the suite). */
export const SUITE_FLAGS = {
  server: { type: 'string' },
  source: { type: 'string' },
  units: { type: 'string' },
  'no-direct': { type: 'boolean', default: false },
  'unit-timeout': { type: 'string', default: '900' },
  help: { type: 'boolean', short: 'h' },
} as const;
