/** The flags of `npm run bench` (its own module, so that tests can read them without starting a benchmark). */
export const BENCH_FLAGS = {
  rounds: { type: 'string' },
  quick: { type: 'boolean' },
  json: { type: 'string' },
  'requests-p1': { type: 'string' },
  'requests-p16': { type: 'string' },
  'lock-seconds': { type: 'string' },
  without: { type: 'string' },
  baseline: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;
