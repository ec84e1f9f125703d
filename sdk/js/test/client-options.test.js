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
    ['http://127.0.0.1', { fetch: 'no' }],
  ]) {
    assert.throws(() => new Client(baseUrl, { apiKey: KEY, ...options }),
      (error) => error instanceof TypeError && !error.message.includes(KEY));
  }
  assert.throws(() => new Client('http://127.0.0.1'), TypeError);
});

test('logging the client or turning it into JSON leaves the key out', () => {
  const client = new Client('https://intentgate.example.com/', { apiKey: KEY });
  assert.ok(client.apiKey === KEY, 'the key is readable on purpose');
  assert.equal(util.inspect(client, { showHidden: true, depth: 5 }).includes(KEY), false);
  assert.equal(JSON.stringify(client).includes(KEY), false);
});
