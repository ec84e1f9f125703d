'use strict';
// What the signers refuse, and that a refusal never carries the key or the secret.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { test } = require('node:test');

const {
  INTEGER_RANGE_MESSAGE, canonicalize, generateEd25519KeyPair, signResponse, signResponseEd25519,
} = require('..');

const HASH = `sha256:${'a'.repeat(64)}`;
const SECRET = `sig_live_${'0'.repeat(64)}`;
const pkcs8 = (key, extra = {}) => key.export({ type: 'pkcs8', format: 'pem', ...extra });
const pemBody = (pem) => pem.split('\n')
  .filter((line) => line && !line.startsWith('-----')).join('');

function assertRefusedWithoutKey(sign, expected, key) {
  let caught;
  try {
    sign();
  } catch (error) {
    caught = error;
  }
  assert.ok(caught, 'expected a refusal');
  assert.equal(caught.name, expected.name);
  assert.match(caught.message, expected.message);
  assert.equal(caught.cause, undefined);
  const printed = `${caught.stack}\n${caught.message}\n${require('node:util').inspect(caught)}`;
  if (typeof key === 'string' && key.includes('PRIVATE KEY')) {
    assert.ok(!printed.includes(pemBody(key)), 'the error holds the private key');
  }
}

test('keys that cannot sign Ed25519 are refused by kind, without their bytes', () => {
  const rsa = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const ec = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const ed448 = crypto.generateKeyPairSync('ed448');
  const x25519 = crypto.generateKeyPairSync('x25519');
  const ed25519 = crypto.generateKeyPairSync('ed25519');
  const cases = [
    [pkcs8(rsa.privateKey), /RSA key/],
    [rsa.privateKey.export({ type: 'pkcs1', format: 'pem' }), /RSA key/],
    [pkcs8(ec.privateKey), /elliptic-curve/],
    [pkcs8(ed448.privateKey), /Ed448/],
    [pkcs8(x25519.privateKey), /X25519/],
    [pkcs8(ed25519.privateKey, { cipher: 'aes-256-cbc', passphrase: 'horse' }), /encrypted/],
    [ed25519.publicKey.export({ type: 'spki', format: 'pem' }), /public key/],
    [ed25519.publicKey, /public key/],
    [rsa.privateKey, /RSA key/],
    [generateEd25519KeyPair().publicKey, /not PEM/],
    ['-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n', /could not be read/],
    ['', /not PEM/],
    [null, /not null/],
    [42, /not a number/],
    [{ pem: pkcs8(ed25519.privateKey) }, /not an object/],
  ];
  for (const [key, message] of cases) {
    assertRefusedWithoutKey(() => signResponseEd25519(key, HASH, 'm', 1, {}),
      { name: 'TypeError', message }, typeof key === 'string' ? key : pkcs8(ed25519.privateKey));
  }
});

test('a damaged Ed25519 PEM is refused without its bytes', () => {
  const pem = generateEd25519KeyPair().privateKeyPem;
  const damaged = pem.replace('MC4C', 'MC5C');
  assertRefusedWithoutKey(() => signResponseEd25519(damaged, HASH, 'm', 1, {}),
    { name: 'TypeError', message: /could not be read/ }, damaged);
});

test('a generated key pair signs, and its public key verifies in both forms', () => {
  const pair = generateEd25519KeyPair();
  const { privateKeyPem, publicKey, publicKeyPem } = pair;
  assert.match(privateKeyPem, /^-----BEGIN PRIVATE KEY-----\n/);
  assert.equal(Buffer.from(publicKey, 'base64').length, 32);
  assert.equal(publicKey.length, 44);
  const signature = signResponseEd25519(privateKeyPem, HASH, 'm', 1, { a: 1 });
  const message = Buffer.from(`${HASH}.m.1.{"a":1}`);
  const raw = crypto.createPublicKey({
    key: { kty: 'OKP', crv: 'Ed25519', x: Buffer.from(publicKey, 'base64').toString('base64url') },
    format: 'jwk',
  });
  for (const key of [raw, crypto.createPublicKey(publicKeyPem)]) {
    assert.ok(crypto.verify(null, message, key, Buffer.from(signature, 'base64')));
  }
  assert.notEqual(generateEd25519KeyPair().publicKey, publicKey);
});

test('logging a key pair leaves the private key out', () => {
  const pair = generateEd25519KeyPair();
  const { inspect } = require('node:util');
  for (const text of [JSON.stringify(pair), inspect(pair), String(Object.keys(pair))]) {
    assert.ok(!text.includes('PRIVATE'));
    assert.ok(!text.includes(pemBody(pair.privateKeyPem)));
  }
});

test('a bad secret is refused without echoing it', () => {
  for (const secret of ['', null, 42, Buffer.from(SECRET), 'sig_live_\ud800']) {
    assert.throws(() => signResponse(secret, HASH, 'm', 1, {}),
      (error) => error instanceof TypeError && /signing secret string/.test(error.message) &&
        !error.message.includes('sig_live_\ud800'));
  }
});

test('the secret is the UTF-8 bytes of the whole string, prefix included', () => {
  const secret = 'sig_live_é';
  const expected = crypto.createHmac('sha256', Buffer.from('sig_live_\xc3\xa9', 'latin1'))
    .update(`${HASH}.m.1.{}`).digest('hex');
  assert.equal(signResponse(secret, HASH, 'm', 1, {}), expected);
  assert.match(expected, /^[0-9a-f]{64}$/);
});

test('safe integers and doubles sign; integers JSON carries beyond 2^53-1 do not', () => {
  const MAX = Number.MAX_SAFE_INTEGER;
  for (const n of [MAX, -MAX, 1e21, -1e21, 1e300, 0.5, -0]) {
    assert.match(signResponse(SECRET, HASH, 'm', 1, { n }), /^[0-9a-f]{64}$/);
  }
  // JSON.stringify writes these as integer tokens, which the gate refuses.
  for (const n of [2 ** 53, -(2 ** 53), 1e20, 999999999999999900000, -12345678901234567000]) {
    assert.equal(JSON.stringify(n).includes('e'), false);
    assert.throws(() => signResponse(SECRET, HASH, 'm', 1, { nested: [{ n }] }),
      { name: 'RangeError', message: INTEGER_RANGE_MESSAGE });
  }
  // canonicalize itself is plain RFC 8785: it writes any finite double.
  assert.equal(canonicalize(2 ** 53), '9007199254740992');
});

test('values with no canonical form are refused, never written as something else', () => {
  const refusals = [
    [{ n: NaN }, 'RangeError'], [{ n: Infinity }, 'RangeError'], [{ n: -Infinity }, 'RangeError'],
    [{ n: 1n }, 'TypeError'], [{ s: 'a\ud800' }, 'TypeError'], [{ ['\udc00']: 1 }, 'TypeError'],
  ];
  for (const [payload, name] of refusals) {
    assert.throws(() => canonicalize(payload), { name });
    assert.throws(() => signResponse(SECRET, HASH, 'm', 1, payload), { name });
  }
  const circular = { a: 1 };
  circular.self = circular;
  assert.throws(() => canonicalize(circular), { name: 'TypeError', message: /circular/ });
  assert.throws(() => canonicalize(undefined), { name: 'TypeError' });
  // the same object twice, side by side, is not a cycle
  const shared = { x: 1 };
  assert.equal(canonicalize({ a: shared, b: [shared] }), '{"a":{"x":1},"b":[{"x":1}]}');
});

test('the payload is signed as JSON.stringify sends it', () => {
  const payload = {
    at: new Date(Date.UTC(2026, 0, 2, 3, 4, 5)),
    gone: undefined,
    fn() {},
    list: [undefined, () => 1, Symbol('s'), new Number(2), new String('s'), new Boolean(false)],
    custom: { toJSON: (key) => ({ key }) },
    [Symbol('hidden')]: 1,
  };
  const sent = JSON.parse(JSON.stringify(payload));
  assert.equal(canonicalize(payload), canonicalize(sent));
  assert.equal(canonicalize(payload),
    '{"at":"2026-01-02T03:04:05.000Z","custom":{"key":"custom"},' +
    '"list":[null,null,null,2,"s",false]}');
});

test('a payload must be a JSON object; hash, match id and timestamp are checked', () => {
  for (const payload of [[], 'text', 1, null]) {
    assert.throws(() => signResponse(SECRET, HASH, 'm', 1, payload),
      /payload must be a JSON object/);
  }
  assert.throws(() => signResponse(SECRET, HASH, '', 1, {}), /matchId/);
  assert.throws(() => signResponse(SECRET, 42, 'm', 1, {}), /intentHash/);
  assert.throws(() => signResponse(SECRET, HASH, 'm', 1.5, {}), /timestamp/);
  assert.throws(() => signResponse(SECRET, HASH, 'm', '1', {}), /timestamp/);
  assert.throws(() => signResponse(SECRET, HASH, 'm', 1, {}, { scheme: 'other' }), /scheme/);
});
