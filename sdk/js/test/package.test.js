'use strict';
// What `npm pack` makes installs into an empty directory, and the README's examples run from it
// against the real service (require() and import) and pass `tsc --noEmit --strict`.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { after, before, test } = require('node:test');
const { promisify } = require('node:util');

const { createAiService } = require('../examples/ai-service');
const { startService } = require('./support/service');

const PACKAGE = path.resolve(__dirname, '..');
const manifest = require('../package.json');

const run = promisify(execFile);
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
const QUIET = ['--no-audit', '--no-fund', '--loglevel=error'];
let directory;
let project;
let service;
let aiService;
let environment;

/** The README's blocks marked `<!-- example: NAME -->`, as {NAME: code}. */
function readmeExamples() {
  const readme = fs.readFileSync(path.join(PACKAGE, 'README.md'), 'utf8');
  const examples = {};
  const marked = /<!-- example: (\S+) -->\n```\w+\n([\s\S]*?)\n```/g;
  for (const [, name, code] of readme.matchAll(marked)) {
    examples[name] = `${code}\n`;
  }
  return examples;
}

async function runIn(cwd, command, args, env = process.env) {
  try {
    return await run(command, args, { cwd, env, maxBuffer: 1 << 24 });
  } catch (error) {
    throw new Error(`${command} ${args.join(' ')} failed (${error.code}):\n${error.stdout}\n`
      + `${error.stderr}`);
  }
}

before(async () => {
  directory = fs.mkdtempSync(path.join(os.tmpdir(), 'intentgate-pack-'));
  project = path.join(directory, 'project');
  fs.mkdirSync(project);
  fs.writeFileSync(path.join(project, 'package.json'),
    JSON.stringify({ name: 'readme-examples', private: true }));
  service = await startService();
  const tenant = await service.createTenant('pro');
  aiService = createAiService({ secret: tenant.signingSecret,
    answer: async (question) => `You asked: ${question}` });
  await new Promise((resolve) => { aiService.listen(0, '127.0.0.1', resolve); });
  environment = { ...process.env, INTENTGATE_BASE_URL: service.url,
    INTENTGATE_API_KEY: tenant.apiKey,
    AI_SERVICE_URL: `http://127.0.0.1:${aiService.address().port}` };
});

after(async () => {
  if (aiService) await new Promise((resolve) => { aiService.close(resolve); });
  if (service) await service.stop();
  if (directory) fs.rmSync(directory, { recursive: true, force: true });
});

test('npm pack makes a tarball that installs into an empty directory', async () => {
  const { stdout } = await runIn(PACKAGE, npm, ['pack', '--json', '--pack-destination', directory,
    ...QUIET]);
  const [packed] = JSON.parse(stdout);
  const files = packed.files.map((file) => file.path);
  assert.ok(files.includes('lib/client.js') && files.includes('index.d.ts'));
  assert.deepEqual(files.filter((file) => /^(test|examples)\//.test(file)), []);
  // No dependencies, so nothing has to come from a registry.
  await runIn(project, npm,
    ['install', '--offline', ...QUIET, path.join(directory, packed.filename)]);
  assert.ok(fs.existsSync(path.join(project, 'node_modules', 'intentgate', 'lib', 'client.js')));
});

test('the README\'s CommonJS example runs guard against the service', async () => {
  const examples = readmeExamples();
  fs.writeFileSync(path.join(project, 'tenant-backend.js'), examples['tenant-backend.js']);
  const { stdout } = await runIn(project, process.execPath, ['tenant-backend.js'], environment);
  assert.match(stdout, /answer: 'You asked: capital of France\?'/);
});

test('the README\'s ES module example runs against the service', async () => {
  const examples = readmeExamples();
  fs.writeFileSync(path.join(project, 'account.mjs'), examples['account.mjs']);
  const { stdout } = await runIn(project, process.execPath, ['account.mjs'], environment);
  assert.match(stdout, /^intent valid until \d{4}-/m);
  assert.match(stdout, /^pro: \d+ verifications this month, \d+ left$/m);
  assert.match(stdout, /^new key key_live_\w+\.\.\. \(2 active\)$/m);
});

test('tsc --noEmit --strict accepts the README\'s examples with the installed types', async () => {
  const examples = readmeExamples();
  for (const [name, code] of Object.entries(examples)) {
    fs.writeFileSync(path.join(project, name), code);
  }
  // The versions pinned in devDependencies, from the npm registry (the package itself has none).
  const pinned = Object.entries(manifest.devDependencies)
    .map(([name, version]) => `${name}@${version}`);
  await runIn(project, npm, ['install', '--no-save', ...QUIET, ...pinned]);
  fs.writeFileSync(path.join(project, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { strict: true, noEmit: true, allowJs: true, checkJs: true,
      module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', types: ['node'] },
    files: Object.keys(examples),
  }));
  const tsc = path.join(project, 'node_modules', 'typescript', 'bin', 'tsc');
  await runIn(project, process.execPath, [tsc, '-p', '.']);
});
