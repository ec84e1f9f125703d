'use strict';
// The client against a server of the test's own that answers what the service never would:
// odd Retry-After values, redirects, success bodies of the wrong shape. Each connection gets the
// next planned answer (the last one repeats), so attempts can be counted.

const assert = require('node:assert/strict');
const net = require('node:net');
const { after, before, beforeEach, test } = require('node:test');

const { Client, IntentGateError, ServiceError } = require('..');

const KEY = `key_live_${'a'.repeat(48)}`;
const FAST = { backoffBase: 1, backoffCap: 5 };
let server;
let url;
let plan = [];
let requests = [];

/** An HTTP/1.1 answer with a JSON body (or the text given) that closes its connection. */
function reply(status, body, headers = {}) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  const lines = Object.entries({ 'Content-Type': 'application/json', ...headers,
    'Content-Length': Buffer.byteLength(text), Connection: 'close' })
    .map(([name, value]) => `${name}: ${value}\r\n`).join('');
  return `HTTP/1.1 ${status} X\r\n${lines}\r\n${text}`;
}

before(async () => {
  server = net.createServer((socket) => {
    let head = '';
    socket.on('data', (chunk) => {
      const already = head.includes('\r\n\r\n');
      head += chunk.toString('latin1');
      if (already || !head.includes('\r\n\r\n')) return;
      requests.push(head.split('\r\n\r\n')[0]);
      const answer = plan[Math.min(requests.length - 1, plan.length - 1)];
      if (answer.head !== undefined) { // the head at once, the body a moment later
        socket.write(answer.head);
        setTimeout(() => socket.end(answer.body), 10);
        return;
      }
      socket.end(typeof answer === 'function' ? answer() : answer);
    });
    socket.on('error', () => {});
  });
  await new Promise((resolve) => { server.listen(0, '127.0.0.1', resolve); });
  url = `http://127.0.0.1:${server.address().port}`;
});

after(() => new Promise((resolve) => { server.close(resolve); }));

beforeEach(() => {
  plan = [];
  requests = [];
});

const USAGE = { email: 't@example.com', plan: 'pro', usage_count: 1, rate_limit: 500000,
  remaining: 499999 };
const busy = (retryAfter) => reply(503, { error: 'busy', request_id: 'rid-503' },
  { 'Retry-After': retryAfter, 'X-Request-Id': 'rid-503' });

test('a 5xx whose Retry-After is beyond a minute is thrown at once, not waited for 1 ms', async () => {
  // 99999999999 s is past setTimeout's 2^31-1 ms, where Node would wait 1 ms instead.
  plan = [busy('99999999999'), reply(200, USAGE)];
  const started = Date.now();
  await assert.rejects(new Client(url, { apiKey: KEY, ...FAST }).usage(),
    (error) => error instanceof ServiceError && error.status === 503
      && error.requestId === 'rid-503');
  assert.equal(requests.length, 1);
  assert.ok(Date.now() - started < 5000);
  requests = [];
  plan = [busy('61'), reply(200, USAGE)];
  await assert.rejects(new Client(url, { apiKey: KEY, ...FAST }).usage(), ServiceError);
  assert.equal(requests.length, 1);
});

test('a Retry-After that is not delay-seconds leaves the backoff to decide', async () => {
  for (const value of ['-1', '1.5', 'Wed, 21 Oct 2015 07:28:00 GMT', '\u00b2']) {
    requests = [];
    plan = [busy(value), reply(200, USAGE)];
    assert.equal((await new Client(url, { apiKey: KEY, ...FAST }).usage()).plan, 'pro');
    assert.equal(requests.length, 2);
  }
});

test('a redirect is not followed, so the key and the body go nowhere else', async () => {
  for (const status of [301, 302, 307, 308]) {
    requests = [];
    plan = [reply(status, '', { Location: `${url}/collect`, 'X-Request-Id': 'rid-proxy' }),
      reply(200, { intent_hash: 'x' })];
    await assert.rejects(new Client(url, { apiKey: KEY, ...FAST }).generate('user-token-123'),
      (error) => error instanceof IntentGateError && error.status === status
        && error.requestId === 'rid-proxy' && /redirect/.test(error.message));
    assert.deepEqual(requests.map((request) => request.split(' ')[1]), ['/v1/intent/generate']);
  }
});

test('a success whose JSON is not the answer is a ServiceError, not undefined fields', async () => {
  const calls = [
    (client) => client.generate('user-token-123'),
    (client) => client.verify(`sha256:${'a'.repeat(64)}`, { match_id: 'm' }),
    (client) => client.usage(),
    (client) => client.rotateKey(),
    (client) => client.listKeys(),
    (client) => client.dailyUsage(),
  ];
  for (const body of [{ status: 'ok' }, [1, 2]]) {
    for (const call of calls) {
      plan = [reply(200, body, { 'X-Request-Id': 'rid-proxy' })];
      const client = new Client(url, { apiKey: KEY, ...FAST });
      await assert.rejects(call(client), (error) => error instanceof ServiceError
        && error.status === 200 && error.requestId === 'rid-proxy');
      assert.equal(client.apiKey, KEY); // rotateKey never takes undefined for the new key
    }
  }
});

test('an answer whose body never settles ends each attempt at the timeout, then in a ServiceError',
  { timeout: 20000 }, async () => {
    // Node 20's fetch never settles the body of a gzip answer it cannot decode that comes
    // after the headers, abort or not; the call used to stay pending (and a process with
    // nothing else to do ended with it unsettled).
    plan = [{ head: 'HTTP/1.1 200 X\r\nContent-Type: application/json\r\n'
      + 'Content-Encoding: gzip\r\nContent-Length: 7\r\nConnection: close\r\n\r\n',
    body: 'garbage' }];
    const client = new Client(url, { apiKey: KEY, timeout: 300, retries: 1, ...FAST });
    await assert.rejects(client.usage(), (error) => error instanceof ServiceError
      && error.maybeSent === true && /^network failure: /.test(error.message));
    assert.equal(requests.length, 2);
  });
