'use strict';
// The client against the real service (started here): every call, and every typed error as the
// service raises it.

const assert = require('node:assert/strict');
const { after, before, test } = require('node:test');
const { inspect } = require('node:util');

const {
  AuthenticationError, Blocked, Client, IntentGateError, QuotaExceededError, RateLimitError,
  ServiceError, ValidationError, generateEd25519KeyPair, signResponse, signResponseEd25519,
} = require('..');
const { startContextStore } = require('./support/fault-proxy');
const { startService } = require('./support/service');

const FAST = { backoffBase: 1, backoffCap: 5 }; // retries without waiting: behaviour, not timing
const HASH = /^sha256:[0-9a-f]{64}$/;
// Key assertions name the key's form, never its value: no key in a test's output.
const KEY = /^key_live_[0-9a-f]{48}$/;
const REQUEST_ID = /^[0-9a-f]{32}$/;
let service;
let store;
let tenant;
let gate;

before(async () => {
  store = await startContextStore();
  service = await startService({ contextStoreUrl: store.url });
  tenant = await service.createTenant('pro');
  gate = new Client(service.url, { apiKey: tenant.apiKey, ...FAST });
});

after(async () => {
  if (service) await service.stop();
  if (store) await store.close();
});

const now = () => Math.floor(Date.now() / 1000);

/** The AI service's signed answer for an intent, with the tenant's signing secret. */
function aiAnswer(intentHash, payload = { answer: 'Paris' }, secret = tenant.signingSecret) {
  const matchId = `m-${Math.random().toString(16).slice(2)}`;
  const timestamp = now();
  return { match_id: matchId, payload, timestamp,
    signature: signResponse(secret, intentHash, matchId, timestamp, payload) };
}

test('generate issues a single-use intent, classed by the context store', async () => {
  const intent = await gate.generate('shop-user-token-1', { ttl: 120 });
  assert.match(intent.intentHash, HASH);
  assert.equal(intent.intentClass, 'commerce');
  assert.ok(Math.abs(intent.expiresAt - (now() + 120)) <= 5);
  assert.notEqual((await gate.generate('shop-user-token-1')).intentHash, intent.intentHash);
});

test('verify clears a signed answer, replays it under its key, and blocks a replay', async () => {
  const { intentHash } = await gate.generate('user-token-123');
  const signed = aiAnswer(intentHash);
  assert.deepEqual(await gate.verify(intentHash, signed, { idempotencyKey: 'order-1' }),
    { cleared: true, reason: null, payload: { answer: 'Paris' }, replayed: false });
  assert.deepEqual(await gate.verify(intentHash, signed, { idempotencyKey: 'order-1' }),
    { cleared: true, reason: null, payload: { answer: 'Paris' }, replayed: true });
  assert.deepEqual(await gate.verify(intentHash, signed),
    { cleared: false, reason: 'ReplayedIntent', payload: null, replayed: false });
});

test('verify blocks a tampered answer and an unknown intent, without throwing', async () => {
  const { intentHash } = await gate.generate('user-token-123');
  const tampered = { ...aiAnswer(intentHash), payload: { answer: 'Lyon' } };
  assert.equal((await gate.verify(intentHash, tampered)).reason, 'InvalidSignature');
  const unknown = `sha256:${'d'.repeat(64)}`;
  assert.equal((await gate.verify(unknown, aiAnswer(unknown))).reason, 'UnknownIntent');
});

test('guard resolves to the cleared payload, calling the AI with the intent hash', async () => {
  const seen = [];
  const payload = await gate.guard('user-token-123', async (intentHash) => {
    seen.push(intentHash);
    return aiAnswer(intentHash, { answer: 42 });
  });
  assert.deepEqual(payload, { answer: 42 });
  assert.equal(seen.length, 1);
  assert.match(seen[0], HASH);
});

test('guard rejects with Blocked and its reason when the gate blocks', async () => {
  const forged = (intentHash) => aiAnswer(intentHash, { answer: 1 }, `sig_live_${'0'.repeat(64)}`);
  const blocked = await gate.guard('user-token-123', forged).catch((error) => error);
  assert.ok(blocked instanceof Blocked && blocked instanceof IntentGateError);
  assert.equal(blocked.reason, 'InvalidSignature');
  assert.equal(blocked.message, 'AI response blocked: InvalidSignature');
  assert.match(blocked.requestId, REQUEST_ID); // the verify's, to quote as with any error
  assert.equal(String(blocked),
    `Blocked: AI response blocked: InvalidSignature (request ${blocked.requestId})`);
  assert.deepEqual(blocked.result,
    { cleared: false, reason: 'InvalidSignature', payload: null, replayed: false });
});

test('usage counts every verification against the plan', async () => {
  const first = await gate.usage();
  const { intentHash } = await gate.generate('user-token-123');
  await gate.verify(intentHash, aiAnswer(intentHash));
  const second = await gate.usage();
  assert.equal(second.plan, 'pro');
  assert.match(second.email, /@example\.com$/);
  assert.equal(second.usageCount, first.usageCount + 1);
  assert.equal(second.rateLimit, 500000);
  assert.equal(second.remaining, second.rateLimit - second.usageCount);
});

test('createKey, listKeys and revokeKey manage the tenant\'s API keys', async () => {
  const made = await gate.createKey('deploy-2', { expiresIn: 3600 });
  assert.ok(KEY.test(made.apiKey), 'apiKey is key_live_ and 48 hex');
  assert.equal(made.name, 'deploy-2');
  assert.ok(made.apiKey.startsWith(made.prefix));
  // The expiry counts from the exact time asked, rounded up to a whole second; created_at is
  // that time's whole second.
  assert.ok([3600, 3601].includes(made.expiresAt - made.createdAt));
  const listed = (await gate.listKeys()).find((key) => key.id === made.id);
  assert.deepEqual(listed, { id: made.id, name: 'deploy-2', prefix: made.prefix,
    scopes: ['intents'], createdAt: made.createdAt, expiresAt: made.expiresAt });
  const second = new Client(service.url, { apiKey: made.apiKey });
  assert.equal((await second.usage()).email, (await gate.usage()).email);

  const revoked = await gate.revokeKey(made.id);
  assert.equal(revoked.id, made.id);
  assert.ok(revoked.revokedAt >= made.createdAt);
  assert.equal((await gate.listKeys()).some((key) => key.id === made.id), false);
  await assert.rejects(second.usage(), (error) => error instanceof AuthenticationError
    && error.status === 401 && error.message === 'Invalid or inactive API key');
});

test('auditLog pages the changes newest first; dailyUsage counts by day and outcome', async () => {
  const entries = await gate.auditLog({ limit: 2 });
  assert.equal(entries.length, 2);
  assert.deepEqual(entries.map((entry) => entry.action), ['api_key.revoked', 'api_key.created']);
  assert.match(entries[0].requestId, REQUEST_ID);
  assert.ok(entries[0].id > entries[1].id && entries[0].at >= entries[1].at);
  const older = await gate.auditLog({ limit: 1, before: entries[1].id });
  assert.ok(older[0].id < entries[1].id);

  const days = await gate.dailyUsage({ days: 3 });
  assert.equal(days.length, 3);
  assert.equal(days[2].date, new Date().toISOString().slice(0, 10));
  assert.ok(days[2].cleared >= 1 && days[2].blocked.InvalidSignature >= 1);
  assert.equal(days[2].verifications,
    days[2].cleared + Object.values(days[2].blocked).reduce((sum, n) => sum + n, 0));
});

test('signing keys and the signature scheme: an Ed25519 answer clears', async () => {
  const { privateKeyPem, publicKey } = generateEd25519KeyPair();
  const added = await gate.addSigningKey(publicKey, { name: 'ai-2026', expiresIn: 86400 });
  assert.equal(added.name, 'ai-2026');
  assert.deepEqual((await gate.listSigningKeys()).map((key) => key.id), [added.id]);
  const switched = await gate.setSignatureScheme('ed25519', { graceSeconds: 60 });
  assert.deepEqual([switched.scheme, switched.previousScheme], ['ed25519', 'bound']);
  assert.ok(switched.previousValidUntil >= now() + 55);

  const payload = await gate.guard('user-token-123', (intentHash) => {
    const timestamp = now();
    return { match_id: 'ed-1', payload: { ok: true }, timestamp,
      signature: signResponseEd25519(privateKeyPem, intentHash, 'ed-1', timestamp, { ok: true }) };
  });
  assert.deepEqual(payload, { ok: true });

  assert.equal((await gate.setSignatureScheme('bound')).scheme, 'bound');
  assert.equal((await gate.revokeSigningKey(added.id)).id, added.id);
  assert.deepEqual(await gate.listSigningKeys(), []);
});

test('rotateKey switches the client to the new key; the old one is refused', async () => {
  const made = await gate.createKey('to-rotate');
  const rotating = new Client(service.url, { apiKey: made.apiKey });
  const rotation = await rotating.rotateKey();
  assert.ok(KEY.test(rotation.newKey), 'newKey is key_live_ and 48 hex');
  assert.match(rotation.message, /invalid/);
  assert.ok(rotating.apiKey === rotation.newKey, 'the client sends the new key');
  assert.ok(!inspect(rotation).includes(rotation.newKey), 'logging the result logs no key');
  assert.equal(JSON.parse(JSON.stringify(rotation)).newKey, rotation.newKey);
  assert.ok((await rotating.usage()).usageCount >= 0);
  await assert.rejects(new Client(service.url, { apiKey: made.apiKey }).usage(),
    AuthenticationError);
  await gate.revokeKey((await gate.listKeys()).find((key) => key.name === 'to-rotate').id);
});

test('AuthenticationError: a wrong key, with the text and request id', async () => {
  const stranger = new Client(service.url, { apiKey: `key_live_${'0'.repeat(48)}` });
  const error = await stranger.generate('user-token-123').catch((caught) => caught);
  assert.ok(error instanceof AuthenticationError && error instanceof IntentGateError);
  assert.equal(error.message, 'invalid or missing X-Service-Key');
  assert.equal(error.status, 401);
  assert.match(error.requestId, REQUEST_ID);
  assert.equal(error.body.request_id, error.requestId);
  assert.match(String(error),
    /^AuthenticationError: invalid or missing X-Service-Key \(status 401/);
});

test('ValidationError: what the service refuses as it stands', async () => {
  await assert.rejects(gate.generate('short'), (error) => error instanceof ValidationError
    && error.status === 400 && error.message === 'token too short'
    && REQUEST_ID.test(error.requestId));
  await assert.rejects(gate.verify(`md5:${'a'.repeat(64)}`, aiAnswer('x')), {
    name: 'ValidationError', message: "intent hash must start with 'sha256:'" });
  await assert.rejects(gate.generate('user-token-123', { ttl: 86401 }),
    { name: 'ValidationError', message: 'ttl must be between 1 and 86400 seconds' });
});

test('RateLimitError: the request bucket runs dry, with retryAfter', async () => {
  const busy = await service.createTenant('pro');
  const client = new Client(service.url, { apiKey: busy.apiKey });
  let error;
  for (let request = 0; request < 400 && !error; request += 1) {
    error = await client.usage().then(() => undefined, (caught) => caught);
  }
  assert.ok(error instanceof RateLimitError && !(error instanceof QuotaExceededError));
  assert.equal(error.message, 'rate limit exceeded');
  assert.equal(error.status, 429);
  assert.ok(Number.isInteger(error.retryAfter) && error.retryAfter > 0);
});

test('QuotaExceededError: the plan\'s month is used up; usage still answers', async () => {
  const free = await service.createTenant('free');
  await service.setUsage(free.tenantId, 1000);
  const client = new Client(service.url, { apiKey: free.apiKey });
  const error = await client.generate('user-token-123').catch((caught) => caught);
  assert.ok(error instanceof QuotaExceededError && error instanceof RateLimitError);
  assert.equal(error.message, 'monthly verification limit reached');
  assert.ok(error.retryAfter > 0);
  assert.deepEqual(pick(await client.usage(), 'usageCount', 'remaining'),
    { usageCount: 1000, remaining: 0 });
});

test('ServiceError: a 5xx that lasts through every retry (the context store is down)', async () => {
  store.failing = true;
  const callsBefore = store.calls;
  try {
    const error = await gate.generate('user-token-123').catch((caught) => caught);
    assert.ok(error instanceof ServiceError);
    assert.equal(error.message, 'context store request failed');
    assert.equal(error.status, 502);
    assert.equal(error.maybeSent, true);
    assert.match(error.requestId, REQUEST_ID);
    assert.equal(store.calls - callsBefore, 4, 'the first attempt and 3 retries');
  } finally {
    store.failing = false;
  }
});

function pick(record, ...names) {
  return Object.fromEntries(names.filter((name) => name in record)
    .map((name) => [name, record[name]]));
}
