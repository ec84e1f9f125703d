'use strict';
// The Node signer agrees byte for byte with the shared vectors in tests/vectors, which the
// Python SDK and the server check too: HMAC (bound and payload schemes), Ed25519 and RFC 8785.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');

const {
  INTEGER_RANGE_MESSAGE, canonicalize, signResponse, signResponseEd25519, signingMessage,
} = require('..');

const VECTORS = path.join(__dirname, '..', '..', '..', 'tests', 'vectors');
const load = (name) => JSON.parse(fs.readFileSync(path.join(VECTORS, name), 'utf8'));
const SIGNATURES = load('signatures.json');
const ED25519 = load('ed25519.json');
const CANONICALIZATION = load('canonicalization.json');
const KEYS = Object.fromEntries(ED25519.keys.map((key) => [key.id, key]));

// The bound message ends with JCS(payload); the payload scheme's message is JCS(payload).
const canonicalPart = (vector) => (vector.scheme === 'payload'
  ? vector.message
  : vector.message.slice(`${vector.intent_hash}.${vector.match_id}.${vector.timestamp}.`.length));

for (const vector of SIGNATURES.vectors) {
  test(`HMAC ${vector.scheme} vector ${vector.match_id}`, () => {
    const args = [vector.intent_hash, vector.match_id, vector.timestamp, vector.payload];
    const options = { scheme: vector.scheme };
    assert.equal(canonicalize(vector.payload), canonicalPart(vector));
    if (vector.refused_in_javascript) {
      assert.throws(() => signResponse(vector.secret, ...args, options),
        { name: 'RangeError', message: vector.refused_in_javascript });
      return;
    }
    assert.equal(signingMessage(...args, options), vector.message);
    assert.equal(signResponse(vector.secret, ...args, options), vector.signature);
  });
}

test('the vectors hold at least one payload-scheme and one bound HMAC vector', () => {
  const schemes = new Set(SIGNATURES.vectors.map((vector) => vector.scheme));
  assert.deepEqual([...schemes].sort(), ['bound', 'payload']);
});

for (const unsignable of SIGNATURES.unsignable) {
  test(`unsignable ${JSON.stringify(unsignable.payload)} is refused by every signer`, () => {
    const [vector] = SIGNATURES.vectors;
    const args = [vector.intent_hash, 'm', 1, unsignable.payload];
    const refusal = { name: 'RangeError', message: unsignable.error };
    assert.equal(unsignable.error, INTEGER_RANGE_MESSAGE);
    for (const scheme of ['bound', 'payload']) {
      assert.throws(() => signResponse(vector.secret, ...args, { scheme }), refusal);
    }
    assert.throws(() => signResponseEd25519(KEYS['test-key-1'].private_key_pem, ...args), refusal);
  });
}

for (const vector of ED25519.vectors) {
  test(`Ed25519 vector ${vector.key} ${vector.match_id}`, () => {
    const pem = KEYS[vector.key].private_key_pem;
    const args = [vector.intent_hash, vector.match_id, vector.timestamp, vector.payload];
    assert.equal(signingMessage(...args), vector.message);
    for (const privateKey of [pem, Buffer.from(pem), crypto.createPrivateKey(pem)]) {
      assert.equal(signResponseEd25519(privateKey, ...args), vector.signature);
    }
    assert.equal(vector.signature.length, 88);
    assert.equal(Buffer.from(vector.signature, 'base64').length, 64);
  });

  test(`Ed25519 vector ${vector.key} ${vector.match_id} verifies with either public key`, () => {
    const key = KEYS[vector.key];
    const x = Buffer.from(key.public_key, 'base64').toString('base64url');
    const raw = crypto.createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x }, format: 'jwk' });
    const spki = crypto.createPublicKey(key.public_key_pem);
    for (const publicKey of [raw, spki]) {
      assert.ok(crypto.verify(null, Buffer.from(vector.message, 'utf8'), publicKey,
        Buffer.from(vector.signature, 'base64')));
    }
  });
}

for (const vector of CANONICALIZATION.vectors) {
  test(`RFC 8785: ${vector.name}`, () => {
    assert.equal(canonicalize(vector.value), vector.canonical);
  });
}

for (const refused of CANONICALIZATION.refused) {
  test(`RFC 8785 refuses: ${refused.name}`, () => {
    const name = refused.reason === 'non-finite number' ? 'RangeError' : 'TypeError';
    assert.throws(() => canonicalize(refused.value), { name });
  });
}

test('the hard numbers reach the canonicalizer as numbers', () => {
  const values = Object.fromEntries(CANONICALIZATION.vectors.map((v) => [v.name, v.value]));
  assert.ok(Object.is(values['-0 as an integer token'], -0));
  assert.equal(values['5e-324: smallest positive double (subnormal)'], Number.MIN_VALUE);
});
