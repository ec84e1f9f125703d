'use strict';
// The Client's arguments are checked when it is made (a TypeError, never a retried "network
// failure" later), and the key stays out of what a log would print.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const util = require('node:util');

const { Client } = require('..');

const KEY = `key_live_${'a'.repeat(48)}`;

test('a bad baseUrl, key or setting is a TypeError that does not quote the key', () => {
  for (const [baseUrl, options] of [
    ['http://exa mple.com', {}], ['ftp://example.com', {}], [undefined, {}],
    ['http://127.0.0.1', { apiKey: `${KEY}\n` }], ['http://127.0.0.1', { apiKey: '' }],
    ['http://127.0.0.1', { timeout: 0 }], ['http://127.0.0.1', { backoffBase: -1 }],
    ['http://127.0.0.1', { backoffCap: Infinity }], ['http://127.0.0.1', { retries: 1.5 }],
    ['http://127.0.0.1', { fetch: 'no' }], ['http://127.0.0.1', { timeout: 2 ** 31 }],
    ['http://127.0.0.1', { timeout: 1e10 }], ['http://127.0.0.1', { backoffCap: 2 ** 31 }],
    // As the Python SDK refuses them: each would fail at every call, as a retried "network
    // failure" (or fetch's TypeError quoting the password).
    ['http://127.0.0.1:8000 ', {}], ['http://127.0.0.1:8000\n', {}], ['http:///x', {}],
    ['http://127.0.0.1:0', {}], ['http://user:hunter2@127.0.0.1', {}],
  ]) {
    assert.throws(() => new Client(baseUrl, { apiKey: KEY, ...options }),
      (error) => error instanceof TypeError && !error.message.includes(KEY)
        && !error.message.includes('hunter2'));
  }
  for (const baseUrl of ['http://127.0.0.1:8000/prefix/', 'HTTPS://Example.com',
    'http://[::1]:80']) {
    assert.ok(new Client(baseUrl, { apiKey: KEY }));
  }
  assert.throws(() => new Client('http://127.0.0.1'), TypeError);
});

test('logging the client or turning it into JSON leaves the key out', () => {
  const client = new Client('https://intentgate.example.com/', { apiKey: KEY });
  assert.ok(client.apiKey === KEY, 'the key is readable on purpose');
  assert.equal(util.inspect(client, { showHidden: true, depth: 5 }).includes(KEY), false);
  assert.equal(JSON.stringify(client).includes(KEY), false);
});

/** A fetch that answers every call with `body` (JSON text). */
function answering(body) {
  return async () => new Response(body,
    { status: 200, headers: { 'Content-Type': 'application/json' } });
}

test('a timeout with a fraction of a millisecond is rounded up, not a failure of every call',
  async () => {
    const usage = '{"email":"t@example.com","plan":"free","usage_count":1,"rate_limit":1000,'
      + '"remaining":999}';
    const client = new Client('http://127.0.0.1', {
      apiKey: KEY, timeout: 0.1 * 3 * 10000, fetch: answering(usage) });
    assert.equal((await client.usage()).usageCount, 1);
  });

test('guard fails closed: a verdict not in the service\'s shape never clears', async () => {
  const intent = '{"intent_hash":"sha256:' + 'b'.repeat(64) + '","intent_class":"other",'
    + '"expires_at":2}';
  for (const verdict of ['{"cleared":"false","reason":null,"payload":null}',
    '{"cleared":1,"reason":null,"payload":{"answer":"ok"}}',
    '{"cleared":true,"reason":7,"payload":null}',
    '{"cleared":true,"reason":null,"payload":"ok"}',
    // Each member of its type, not of its verdict.
    '{"cleared":true,"reason":"InvalidSignature","payload":null}',
    '{"cleared":true,"reason":null,"payload":null}',
    '{"cleared":false,"reason":null,"payload":{"answer":"ok"}}',
    '{"cleared":false,"reason":null,"payload":null}']) {
    const fetch = async (url) => new Response(url.endsWith('/generate') ? intent : verdict,
      { status: 200, headers: { 'Content-Type': 'application/json' } });
    const client = new Client('http://127.0.0.1', { apiKey: KEY, fetch });
    await assert.rejects(client.guard('user-token-123', async () => ({})),
      (error) => error.name === 'ServiceError' && /without a verdict/.test(error.message),
      verdict);
  }
});

test('a list that is not a list of records is a ServiceError, not a TypeError', async () => {
  for (const [call, member] of [[(client) => client.listKeys(), 'keys'],
    [(client) => client.listSigningKeys(), 'signing_keys'],
    [(client) => client.auditLog(), 'entries'], [(client) => client.dailyUsage(), 'days']]) {
    for (const records of ['"abc"', 'null', '{"id":1}', '[1,2]', '[null]']) {
      const client = new Client('http://127.0.0.1', {
        apiKey: KEY, fetch: answering(`{"${member}":${records}}`) });
      await assert.rejects(call(client), (error) => error.name === 'ServiceError'
        && error.message === `the service answered 200 without a list of ${member}`, records);
    }
  }
});
