'use strict';
// The README's AI service answers with a response the gate can check, in both schemes.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const http = require('node:http');
const { test } = require('node:test');

const { generateEd25519KeyPair, signResponse } = require('..');
const { createAiService } = require('../examples/ai-service');

const HASH = `sha256:${'b'.repeat(64)}`;
const SECRET = `sig_live_${'1'.repeat(64)}`;

async function ask(service, headers, body) {
  await new Promise((resolve) => service.listen(0, '127.0.0.1', resolve));
  try {
    const { port } = service.address();
    return await new Promise((resolve, reject) => {
      const request = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/answer',
        headers: { 'Content-Type': 'application/json', ...headers }, timeout: 10000 },
      (response) => {
        const chunks = [];
        response.on('data', (chunk) => chunks.push(chunk));
        response.on('end', () => resolve({ status: response.statusCode,
          body: JSON.parse(Buffer.concat(chunks).toString('utf8')) }));
      });
      request.on('timeout', () => request.destroy(new Error('no answer within 10 s')));
      request.on('error', reject);
      request.end(body);
    });
  } finally {
    service.close();
  }
}

const answer = async (question) => `You asked: ${question}`;
const BOUNDED = { timeout: 20000 };

test('with a secret it answers with an HMAC signature for X-Intent-Hash', BOUNDED, async () => {
  const service = createAiService({ secret: SECRET, answer });
  const before = Math.floor(Date.now() / 1000);
  const { status, body } = await ask(service, { 'X-Intent-Hash': HASH },
    '{"q": "capital of France?"}');
  assert.equal(status, 200);
  assert.deepEqual(body.payload, { answer: 'You asked: capital of France?' });
  assert.ok(body.timestamp >= before && body.timestamp <= Math.floor(Date.now() / 1000));
  assert.equal(body.signature,
    signResponse(SECRET, HASH, body.match_id, body.timestamp, body.payload));
});

test('with an Ed25519 key it answers with a signature its public key checks', BOUNDED, async () => {
  const { privateKeyPem, publicKeyPem } = generateEd25519KeyPair();
  const service = createAiService({ privateKey: privateKeyPem, answer });
  const { status, body } = await ask(service, { 'X-Intent-Hash': HASH }, '{"q": "hi"}');
  assert.equal(status, 200);
  const message = `${HASH}.${body.match_id}.${body.timestamp}.{"answer":"You asked: hi"}`;
  assert.ok(crypto.verify(null, Buffer.from(message), crypto.createPublicKey(publicKeyPem),
    Buffer.from(body.signature, 'base64')));
});

test('without an intent hash it signs nothing', BOUNDED, async () => {
  const service = createAiService({ secret: SECRET, answer });
  const { status, body } = await ask(service, {}, '{"q": "hi"}');
  assert.equal(status, 400);
  assert.equal(body.signature, undefined);
});
