'use strict';
// verifyWebhook accepts what the service signs and nothing else: every request that does not
// verify, however malformed, is a WebhookVerificationError (a receiver answers it 400), never
// another error. The Python side (sdk/tests/test_node_parity.py) checks it against the
// service's own signer.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { test } = require('node:test');

const { WebhookVerificationError, verifyWebhook } = require('..');

const SECRET = `whsec_${Buffer.from('k'.repeat(24)).toString('base64')}`;
const BODY = '{"type":"webhook.test","timestamp":"2026-11-27T04:00:00Z",'
  + '"data":{"webhook_id":"we_1"}}';
const NOW = 1_800_000_000;

function signed(body = BODY, { id = 'msg_1', at = NOW, secret = SECRET } = {}) {
  const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
  const signature = crypto.createHmac('sha256', key).update(`${id}.${at}.${body}`)
    .digest('base64');
  return { 'webhook-id': id, 'webhook-timestamp': String(at),
    'webhook-signature': `v1,${signature}` };
}

test('a signed event is returned with its id, from a string, bytes or fetch Headers', () => {
  const expected = { id: 'msg_1', type: 'webhook.test', timestamp: '2026-11-27T04:00:00Z',
    data: { webhook_id: 'we_1' } };
  assert.deepEqual(verifyWebhook(SECRET, BODY, signed(), { now: NOW }), expected);
  assert.deepEqual(verifyWebhook(SECRET, Buffer.from(BODY), signed(), { now: NOW }), expected);
  assert.deepEqual(verifyWebhook(SECRET, new TextEncoder().encode(BODY),
    new Headers(signed()), { now: NOW + 299 }), expected);
});

test('a secret read from a file with its line break verifies', () => {
  assert.equal(verifyWebhook(`${SECRET}\n`, BODY, signed(), { now: NOW }).id, 'msg_1');
});

test('either of two signatures verifies during a secret rotation', () => {
  const other = `whsec_${Buffer.from('o'.repeat(24)).toString('base64')}`;
  const headers = signed();
  headers['webhook-signature'] += ` ${signed(BODY, { secret: other })['webhook-signature']}`;
  assert.equal(verifyWebhook(other, BODY, headers, { now: NOW }).id, 'msg_1');
  assert.equal(verifyWebhook(SECRET, BODY, headers, { now: NOW }).id, 'msg_1');
});

test('a changed, late, unsigned or malformed request is a WebhookVerificationError', () => {
  const cases = [
    [BODY.replace('we_1', 'we_2'), signed()],
    [BODY, { ...signed(), 'webhook-id': 'msg_2' }],
    [BODY, signed(BODY, { at: NOW - 301 })],
    [BODY, signed(BODY, { at: NOW + 301 })],
    [BODY, { ...signed(), 'webhook-signature': undefined }],
    [BODY, { ...signed(), 'webhook-signature': 'garbage' }],
    [BODY, { ...signed(), 'webhook-signature': 'v1,not base64!' }],
    [BODY, { ...signed(), 'webhook-signature': 'v2,AAAA' }],
    [BODY, { ...signed(), 'webhook-signature': `v1,!!${signed()['webhook-signature'].slice(3)}` }],
    [BODY, { ...signed(), 'webhook-timestamp': '1e9' }],
    [BODY, { ...signed(), 'webhook-timestamp': ['1', '2'] }],
    [Buffer.from([0xff, 0xfe, 0x7b, 0x7d]), signed('\ufffd\ufffd{}')],
    ['[1]', signed('[1]')],
    ['not json', signed('not json')],
    [BODY, {}],
  ];
  for (const [body, headers] of cases) {
    assert.throws(() => verifyWebhook(SECRET, body, headers, { now: NOW }),
      WebhookVerificationError, JSON.stringify(headers));
  }
});

test('a secret that is not whsec_, or a parsed body, is the receiver\'s mistake: a TypeError',
  () => {
    for (const secret of ['sig_live_' + 'a'.repeat(64), 'whsec_', 'whsec_!!', undefined]) {
      assert.throws(() => verifyWebhook(secret, BODY, signed(), { now: NOW }), TypeError);
    }
    assert.throws(() => verifyWebhook(SECRET, JSON.parse(BODY), signed(), { now: NOW }),
      TypeError);
  });
