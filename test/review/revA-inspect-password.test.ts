/**
 * revA (hostile review): `stream-dedup inspect postgres://… --schema S` must never print the
 * password. The CLI redacts with `url.replace(/:[^:@/]*@/, ':***@')`, which misses
 *  - a password given as a query parameter (`?password=…`, which pg-connection-string honours), and
 *  - a password containing ':' (WHATWG URL splits userinfo at the FIRST ':'; the regex redacts only
 *    what follows the LAST ':').
 * Needs the project's PostgreSQL (`bash scripts/postgres.sh up`).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { runCli } from '../support/cli.js';
import { PG_URL, useSchema } from '../support/postgres.js';

const ROLE = `reva_${process.pid}`;
const SECRET_TAIL = 'TOPSECRETtail';
const PASSWORD = `head:${SECRET_TAIL}`; // a ':' inside the password
let db: Awaited<ReturnType<typeof useSchema>>;
const u = new URL(PG_URL);

beforeAll(async () => {
  db = await useSchema();
  await db.pool.query(`DROP ROLE IF EXISTS ${ROLE}`);
  await db.pool.query(`CREATE ROLE ${ROLE} LOGIN PASSWORD '${PASSWORD}'`);
  await db.pool.query(`GRANT USAGE ON SCHEMA "${db.schema}" TO ${ROLE}`);
  await db.pool.query(`GRANT SELECT ON ALL TABLES IN SCHEMA "${db.schema}" TO ${ROLE}`);
});
afterAll(async () => {
  await db.pool.query(`DROP SCHEMA IF EXISTS "${db.schema}" CASCADE`).catch(() => undefined);
  await db.pool.query(`DROP OWNED BY ${ROLE}`).catch(() => undefined);
  await db.pool.query(`DROP ROLE IF EXISTS ${ROLE}`).catch(() => undefined);
  await db.drop();
});

describe('revA: inspect postgres:// prints no password', () => {
  it('a password given as ?password= is not printed', async () => {
    const url = `postgres://${u.username}@${u.host}${u.pathname}?password=${encodeURIComponent(decodeURIComponent(u.password))}`;
    // pg accepts it: the read works.
    const run = await runCli(['inspect', url, '--schema', db.schema]);
    expect(run.code).toBe(0);
    expect(run.stdout + run.stderr).not.toContain(decodeURIComponent(u.password));
  }, 60_000);

  it('a password containing ":" is not printed, not even in part', async () => {
    const url = `postgres://${ROLE}:${PASSWORD}@${u.host}${u.pathname}`;
    // pg parses it as user ROLE, password "head:TOPSECRETtail" (it connects).
    const check = new pg.Client({ connectionString: url });
    await check.connect();
    await check.end();
    const run = await runCli(['inspect', url, '--schema', db.schema]);
    expect(run.code).toBe(0);
    expect(run.stdout + run.stderr).not.toContain('head');
  }, 60_000);
});
