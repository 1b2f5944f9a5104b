// ESLint flat config. Deliberately the non-type-checked typescript-eslint
// preset: it needs no TypeScript program, so `eslint .` stays fast; type
// errors are caught by `tsc --noEmit` in `npm run lint` instead.
import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import tseslint from 'typescript-eslint';

export default defineConfig(
  { ignores: ['dist/', 'node_modules/', 'coverage/', '.bench/', '.stress/', '.suite/'] },
  {
    // Plain JS at the root (this file) gets the core rules only.
    files: ['**/*.js'],
    extends: [js.configs.recommended],
  },
  {
    // vitest.config.ts and friends are listed so that naming them on the
    // command line lints them instead of warning "no matching configuration".
    files: ['src/**/*.ts', 'test/**/*.ts', '*.config.ts'],
    extends: [js.configs.recommended, tseslint.configs.recommended],
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_' }],
    },
  },
);
