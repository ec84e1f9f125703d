// The package loads with import and with require(), through its "exports", as one module.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { test } from 'node:test';

import signer, {
  Blocked, Client, IntentGateError, ServiceError, canonicalize, generateEd25519KeyPair,
  signResponse, signResponseEd25519,
} from 'intentgate';

const require = createRequire(import.meta.url);

test('import and require() give the same functions', () => {
  const required = require('intentgate');
  assert.equal(required.signResponse, signResponse);
  assert.equal(required.signResponseEd25519, signResponseEd25519);
  assert.equal(required.canonicalize, canonicalize);
  assert.equal(required.generateEd25519KeyPair, generateEd25519KeyPair);
  assert.equal(signer, required);
  // index.d.ts declares a default export for both: TypeScript compiled to CommonJS reads it
  // as require('intentgate').default.
  assert.equal(required.default, required);
});

test('import and require() give the same Client and error classes', () => {
  const required = require('intentgate');
  assert.equal(required.Client, Client);
  // One class whichever way it was loaded, so instanceof holds across both.
  assert.equal(required.ServiceError, ServiceError);
  assert.ok(new required.Blocked('InvalidSignature') instanceof Blocked);
  assert.ok(new Blocked('InvalidSignature') instanceof IntentGateError);
});

test('the package has no runtime dependency', () => {
  const manifest = require('intentgate/package.json');
  assert.equal(manifest.dependencies, undefined);
  assert.ok(manifest.engines.node.startsWith('>=18'));
});
