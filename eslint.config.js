// Type-aware lint: the rules that catch real bugs in async code (floating and misused promises).
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

/** The package's own name in an import from src/: the module itself is imported instead. */
const SELF_REFERENCE = {
  regex: '^stream-dedup(/|$)',
  message: 'import the module itself, not the package by its own name (the layering check cannot follow it)',
};

export default tseslint.config(
  { ignores: ['dist/', 'coverage/', 'node_modules/', 'docs/api/'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // pg is an optional peer dependency: only the PostgreSQL store's entry may load it (issue 34).
    // And no module of src/ imports the package by its own name: such an import resolves into dist/
    // (or nowhere), where the layering check (npm run layers) cannot see it (review B).
    files: ['src/**/*.ts'],
    ignores: ['src/postgres/**'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          paths: [{ name: 'pg', message: 'only src/postgres/ imports pg (an optional peer dependency)' }],
          patterns: [SELF_REFERENCE],
        },
      ],
    },
  },
  {
    files: ['src/postgres/**/*.ts'],
    rules: { 'no-restricted-imports': ['error', { patterns: [SELF_REFERENCE] }] },
  },
  {
    // Every connection the library (and the fault tests' shared rigs) take of a pg pool goes through
    // checkout(): a client taken with `await pool.connect()` has no 'error' listener for a moment,
    // and a server dying then crashed the host (CI). Single tests that never stop the server may.
    files: ['src/postgres/**/*.ts', 'test/support/**/*.ts', 'test/fixtures/**/*.ts'],
    ignores: ['src/postgres/checkout.ts'],
    rules: {
      'no-restricted-syntax': [
        'error',
        {
          selector: "CallExpression[callee.property.name='connect'][callee.object.name=/[pP]ool$/]",
          message:
            "take pool connections with checkout() (src/postgres/checkout.ts): after `await pool.connect()` a dying server's error has no listener",
        },
        {
          selector: "CallExpression[callee.property.name='connect'][callee.object.property.name=/[pP]ool$/]",
          message:
            "take pool connections with checkout() (src/postgres/checkout.ts): after `await pool.connect()` a dying server's error has no listener",
        },
      ],
    },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: { process: 'readonly', console: 'readonly' },
    },
  },
);
