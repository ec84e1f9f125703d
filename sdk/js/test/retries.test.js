'use strict';
// The retry rules against the real service behind a fault-injecting proxy of the test's own:
// 5xx and network failures retried at most 3 times, Retry-After honoured, 4xx never, one
// Idempotency-Key across a verify's attempts, rotateKey retried only when it was not sent.

const assert = require('node:assert/strict');
const { after, afterEach, before, test } = require('node:test');

const { AuthenticationError, Client, RateLimitError, ServiceError, ValidationError, signResponse } =
  require('..');
const { closedPort, fault, startFaultProxy } = require('./support/fault-proxy');
const { startService } = require('./support/service');

const FAST = { backoffBase: 1, backoffCap: 5 }; // retries without waiting: behaviour, not timing
let service;
let proxy;
let tenant;

before(async () => {
  service = await startService();
  tenant = await service.createTenant('pro');
  proxy = await startFaultProxy(service.url);
});

after(async () => {
  if (proxy) await proxy.close();
  if (service) await service.stop();
});

afterEach(() => proxy.reset());

const viaProxy = (options = {}) => new Client(proxy.url,
  { apiKey: tenant.apiKey, ...FAST, ...options });
const direct = (apiKey) => new Client(service.url, { apiKey, ...FAST });
const attempts = (path) => proxy.requests.filter((request) => request.path === path);

/** The AI service's signed answer for an intent. */
function signed(intentHash) {
  const matchId = `m-${Math.random().toString(16).slice(2)}`;
  const timestamp = Math.floor(Date.now() / 1000);
  const payload = { answer: 'ok' };
  return { match_id: matchId, payload, timestamp,
    signature: signResponse(tenant.signingSecret, intentHash, matchId, timestamp, payload) };
}

test('a 503 then a 200: the call succeeds on its second attempt', async () => {
  proxy.plan(fault.answer(503));
  assert.equal((await viaProxy().usage()).plan, 'pro');
  assert.equal(attempts('/v1/tenant/usage').length, 2);
});

test('a verify whose answer was lost is retried with one Idempotency-Key: the first verdict '
  + 'comes back, not ReplayedIntent', async () => {
  const client = viaProxy();
  const { intentHash } = await client.generate('user-token-123');
  proxy.plan(fault.answerAfterForwarding(503)); // the service cleared it; the answer is lost
  const result = await client.verify(intentHash, signed(intentHash));
  assert.deepEqual(result, { cleared: true, reason: null, payload: { answer: 'ok' },
    replayed: true });
  const keys = attempts('/v1/intent/verify').map((request) => request.headers['idempotency-key']);
  assert.equal(keys.length, 2);
  assert.equal(new Set(keys).size, 1);
  assert.match(keys[0], /^[0-9a-f]{32}$/);
});

test('Retry-After from the service sets the wait', async () => {
  proxy.plan(fault.answer(503, { 'Retry-After': '1' }));
  await viaProxy().usage();
  const [first, second] = attempts('/v1/tenant/usage');
  // The backoff alone would wait at most 1 ms (FAST); Retry-After asks for a second.
  assert.ok(second.at - first.at >= 950, `waited ${second.at - first.at} ms`);
});

test('4xx answers are never retried, 429 included', async () => {
  const client = viaProxy();
  await assert.rejects(client.generate('short'), ValidationError);
  assert.equal(attempts('/v1/intent/generate').length, 1);

  await assert.rejects(viaProxy({ apiKey: `key_live_${'0'.repeat(48)}` }).usage(),
    AuthenticationError);
  proxy.plan(fault.answer(429, { 'Retry-After': '7' }, 'rate limit exceeded'));
  const limited = await client.usage().catch((error) => error);
  assert.ok(limited instanceof RateLimitError);
  assert.equal(limited.retryAfter, 7);
  assert.equal(limited.requestId, 'proxy-1');
  assert.equal(attempts('/v1/tenant/usage').length, 2); // one each
});

test('a network failure is retried', async () => {
  proxy.plan(fault.drop());
  assert.equal((await viaProxy().usage()).plan, 'pro');
  assert.equal(attempts('/v1/tenant/usage').length, 2);
});

test('at most 3 retries (4 attempts), then ServiceError with the last answer', async () => {
  proxy.plan(...Array(10).fill(fault.answer(503)));
  const error = await viaProxy().usage().catch((caught) => caught);
  assert.ok(error instanceof ServiceError);
  assert.deepEqual([error.status, error.requestId, error.maybeSent], [503, 'proxy-4', true]);
  assert.equal(attempts('/v1/tenant/usage').length, 4);

  proxy.reset();
  proxy.plan(...Array(10).fill(fault.answer(500)));
  await assert.rejects(viaProxy({ retries: 1 }).usage(), ServiceError);
  assert.equal(attempts('/v1/tenant/usage').length, 2);
});

test('a timeout is a network failure, retried, and may have been sent', async () => {
  proxy.plan(fault.stall(), fault.stall());
  const error = await viaProxy({ timeout: 300, retries: 1 }).usage().catch((caught) => caught);
  assert.ok(error instanceof ServiceError);
  assert.equal(error.message, 'network failure: TimeoutError');
  assert.equal(error.maybeSent, true);
  assert.equal(attempts('/v1/tenant/usage').length, 2);
});

test('a refused connection is retried, then ServiceError with maybeSent false', async () => {
  let calls = 0;
  const counting = (url, init) => { calls += 1; return fetch(url, init); };
  const client = new Client(`http://127.0.0.1:${await closedPort()}`,
    { apiKey: tenant.apiKey, ...FAST, fetch: counting });
  const error = await client.rotateKey().catch((caught) => caught);
  assert.ok(error instanceof ServiceError);
  assert.equal(error.message, 'network failure: ECONNREFUSED');
  assert.equal(error.maybeSent, false);
  assert.equal(calls, 4, 'never sent, so even rotateKey is retried');
  assert.ok(client.apiKey === tenant.apiKey, 'the client keeps its key');
});

test('rotateKey that could not be sent is retried, and the client switches keys', async () => {
  const { apiKey } = await direct(tenant.apiKey).createKey('rotate-after-refusal');
  const refused = `http://127.0.0.1:${await closedPort()}`;
  let calls = 0;
  const firstRefused = (url, init) => {
    calls += 1;
    return fetch(calls === 1 ? url.replace(service.url, refused) : url, init);
  };
  const client = new Client(service.url, { apiKey, ...FAST, fetch: firstRefused });
  const rotation = await client.rotateKey();
  assert.equal(calls, 2);
  assert.ok(client.apiKey === rotation.newKey, 'the client sends the new key');
  assert.equal((await client.usage()).plan, 'pro');
  await assert.rejects(direct(apiKey).usage(), AuthenticationError);
});

test('rotateKey that may have been sent is not retried: a dropped answer, a 5xx', async () => {
  const { apiKey } = await direct(tenant.apiKey).createKey('rotate-dropped');
  const client = viaProxy({ apiKey });
  proxy.plan(fault.dropAfterForwarding()); // the service rotated; the answer never came
  const dropped = await client.rotateKey().catch((caught) => caught);
  assert.ok(dropped instanceof ServiceError);
  assert.equal(dropped.maybeSent, true);
  assert.equal(attempts('/v1/tenant/rotate-key').length, 1);
  assert.ok(client.apiKey === apiKey, 'the client keeps its key');
  // It did rotate: the old key is dead, which is why a retry could only have got 401.
  await assert.rejects(direct(apiKey).usage(), AuthenticationError);

  const { apiKey: other } = await direct(tenant.apiKey).createKey('rotate-503');
  proxy.plan(fault.answer(503));
  const failed = await viaProxy({ apiKey: other }).rotateKey().catch((caught) => caught);
  assert.deepEqual([failed.name, failed.status, failed.maybeSent], ['ServiceError', 503, true]);
  assert.equal(attempts('/v1/tenant/rotate-key').length, 2); // one each
});

test('createKey sends scopes only when given', async () => {
  const client = viaProxy();
  const plain = await client.createKey('no-scopes');
  assert.equal('scopes' in JSON.parse(attempts('/v1/tenant/keys')[0].body), false);
  await client.revokeKey(plain.id);
  assert.deepEqual(plain.scopes, ['intents']);
  const scoped = await client.createKey('scoped', { scopes: ['intents', 'usage:read'] });
  const sent = JSON.parse(attempts('/v1/tenant/keys').at(-1).body);
  assert.deepEqual(sent, { name: 'scoped', scopes: ['intents', 'usage:read'] });
  assert.deepEqual(scoped.scopes, ['intents', 'usage:read']);
  // The narrow key is refused what its scopes do not allow, with the scope named.
  const narrow = direct(scoped.apiKey);
  const refused = await narrow.setSignatureScheme('bound').catch((caught) => caught);
  assert.ok(refused instanceof AuthenticationError);
  assert.deepEqual([refused.status, refused.message],
    [403, 'this key lacks the scope signing:write']);
  await client.revokeKey(scoped.id);
});

test('a body without a JSON form is refused before anything is sent', async () => {
  const client = viaProxy();
  await assert.rejects(client.generate('user-token-123', { ttl: Infinity }),
    { name: 'ValidationError', message: /request body cannot be sent as JSON/ });
  await assert.rejects(client.verify(`sha256:${'a'.repeat(64)}`, { payload: { n: 1n } }),
    ValidationError);
  await assert.rejects(client.verify(`sha256:${'a'.repeat(64)}`, signed('x'),
    { idempotencyKey: 'not\nprintable' }), { name: 'ValidationError', message: /Idempotency-Key/ });
  // fetch would strip the spaces and send another key, whose stored verdict would answer.
  await assert.rejects(client.verify(`sha256:${'a'.repeat(64)}`, signed('x'),
    { idempotencyKey: ' order-1 ' }), { name: 'ValidationError', message: /at either end/ });
  assert.equal(proxy.requests.length, 0);
});

test('options given as a plain value, as the Python SDK takes them, are refused before '
  + 'anything is sent, not read as no options', async () => {
  const client = viaProxy();
  const hash = `sha256:${'a'.repeat(64)}`;
  for (const [call, method] of [
    [() => client.generate('user-token-123', 600), 'generate'],
    [() => client.verify(hash, signed('x'), 'order-1'), 'verify'],
    [() => client.guard('user-token-123', async () => signed('x'), 600), 'guard'],
    [() => client.createKey('n', 3600), 'createKey'],
    [() => client.addSigningKey('AAAA', 'laptop'), 'addSigningKey'],
    [() => client.setSignatureScheme('ed25519', 3600), 'setSignatureScheme'],
    [() => client.auditLog(10), 'auditLog'],
    [() => client.dailyUsage(7), 'dailyUsage'],
    [() => client.dailyUsage(null), 'dailyUsage'],
  ]) {
    await assert.rejects(call(), (error) => error instanceof TypeError
      && error.message.startsWith(`${method}'s options must be an object`));
  }
  assert.equal(proxy.requests.length, 0);
});
