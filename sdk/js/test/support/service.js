'use strict';
// The real service, for the client's tests: gunicorn from the repository's .venv on the embedded
// defaults (SQLite in a temporary directory, no Redis, a fresh SECRET_ENCRYPTION_KEY), on a free
// port, with tenants made by its own CLI. Nothing here reads or writes the repository's
// instance/ or any shared database.

const { execFile, spawn } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { promisify } = require('node:util');

const ROOT = path.resolve(__dirname, '../../../..');
const PYTHON = path.join(ROOT, '.venv', 'bin', 'python');
const run = promisify(execFile);

/** Throw, saying how to make it, when `root` has no .venv to run the service from. */
function requireVenv(root = ROOT) {
  if (!fs.existsSync(path.join(root, '.venv', 'bin', 'python'))) {
    throw new Error(`The client's tests run the real service from the repository's virtualenv, `
      + `and there is none at ${path.join(root, '.venv')}. Make it once, at the repository root `
      + `(${root}):\n  python3.11 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt\n`
      + '(.ci/run does the same before it runs npm test.)');
  }
}

async function freePort() {
  const probe = net.createServer();
  await new Promise((resolve) => { probe.listen(0, '127.0.0.1', resolve); });
  const { port } = probe.address();
  await new Promise((resolve) => { probe.close(resolve); });
  return port;
}

// A Fernet key: 32 random bytes in url-safe base64, padding kept.
const fernetKey = () => crypto.randomBytes(32).toString('base64').replace(/\+/g, '-')
  .replace(/\//g, '_');

class Service {
  constructor(directory, environment) {
    this.directory = directory;
    this.environment = environment;
    this.logPath = path.join(directory, 'service.log');
    this.url = `http://${environment.GUNICORN_BIND}`;
    this.process = null;
  }

  /** Run `flask --app wsgi ...args` against this service's database; resolve to its stdout. */
  async flask(...args) {
    return (await this.#python(['-m', 'flask', '--app', 'wsgi', ...args])).trim();
  }

  /** A tenant made as an operator makes one: {tenantId, apiKey, signingSecret}. */
  async createTenant(plan = 'pro') {
    const email = `node-${crypto.randomBytes(6).toString('hex')}@example.com`;
    const made = JSON.parse(await this.flask('tenants', 'create', '--email', email, '--plan', plan,
      '--json'));
    return { tenantId: made.tenant_id, apiKey: made.api_key, signingSecret: made.signing_secret };
  }

  /** Set this month's count of a tenant's verifications, as the Python tests do (there is no API
   *  for it: only verifications count). */
  async setUsage(tenantId, count) {
    await this.#python(['-c', [
      'import sys',
      'from tests.support import set_usage',
      'from wsgi import app',
      'set_usage(app, int(sys.argv[1]), int(sys.argv[2]))',
    ].join('\n'), String(tenantId), String(count)]);
  }

  async start() {
    await this.flask('db', 'upgrade');
    const log = fs.openSync(this.logPath, 'a');
    this.process = spawn(PYTHON, ['-m', 'gunicorn', '-c', 'deploy/gunicorn.conf.py', 'wsgi:app'],
      { cwd: ROOT, env: this.environment, stdio: ['ignore', log, log] });
    fs.closeSync(log);
    const exited = new Promise((resolve) => { this.process.once('exit', resolve); });
    const deadline = Date.now() + 60000;
    while (Date.now() < deadline) {
      const stopped = await Promise.race([exited, new Promise((r) => { setTimeout(r, 100); })]);
      if (stopped !== undefined) throw new Error(`gunicorn exited early:\n${this.#logTail()}`);
      try {
        if ((await fetch(`${this.url}/health`)).status === 200) return this;
      } catch { /* not listening yet */ }
    }
    await this.stop();
    throw new Error(`the service did not become healthy within 60 s:\n${this.#logTail()}`);
  }

  async stop() {
    const child = this.process;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => { child.once('exit', resolve); });
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 15000);
      await exited;
      clearTimeout(timer);
    }
    fs.rmSync(this.directory, { recursive: true, force: true });
  }

  async #python(args) {
    try {
      return (await run(PYTHON, args, { cwd: ROOT, env: this.environment })).stdout;
    } catch (error) {
      // stderr says why; stdout is left out, as it may hold a key printed once.
      throw new Error(`${path.basename(PYTHON)} ${args.slice(0, 5).join(' ')} failed:\n`
        + `${error.stderr || error.message}`);
    }
  }

  #logTail() {
    try {
      return fs.readFileSync(this.logPath, 'utf8').slice(-3000);
    } catch {
      return '(no log)';
    }
  }
}

/** Start the service; `contextStoreUrl` replaces the built-in deriver by a context store. */
async function startService({ contextStoreUrl } = {}) {
  requireVenv();
  const directory = fs.mkdtempSync(path.join(os.tmpdir(), 'intentgate-node-'));
  // A clean environment: nothing inherited may point the service at a shared database or Redis.
  const environment = {
    PATH: process.env.PATH,
    HOME: process.env.HOME || directory,
    LANG: 'C.UTF-8',
    DEPLOYMENT_MODE: 'local',
    DATABASE_URL: `sqlite:///${path.join(directory, 'intentgate.db')}`,
    SECRET_ENCRYPTION_KEY: fernetKey(),
    GUNICORN_BIND: `127.0.0.1:${await freePort()}`,
    GUNICORN_WORKERS: '1',
    GUNICORN_THREADS: '4',
    LOG_LEVEL: 'WARNING',
    ...(contextStoreUrl ? { CONTEXT_STORE_URL: contextStoreUrl } : {}),
  };
  const service = new Service(directory, environment);
  // However the test process ends, the gunicorn it started ends with it.
  process.once('exit', () => { if (service.process) service.process.kill('SIGKILL'); });
  try {
    return await service.start();
  } catch (error) {
    await service.stop();
    throw error;
  }
}

module.exports = { requireVenv, startService };
