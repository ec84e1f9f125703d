'use strict';
// Ed25519 keys for the `ed25519` scheme: the AI service keeps the private key, the tenant
// registers the public key. No error thrown here holds key material, only the kind of key.

const crypto = require('node:crypto');

const NOT_A_PRIVATE_KEY = 'privateKey must be an Ed25519 private key: PEM text (PKCS#8, ' +
  "'-----BEGIN PRIVATE KEY-----') or a private KeyObject";
const PUBLIC_KEY_GIVEN = 'privateKey is a public key, which cannot sign: pass the private ' +
  'key (register the public key with the service)';
const KIND_NAMES = {
  rsa: 'an RSA key',
  'rsa-pss': 'an RSA-PSS key',
  dsa: 'a DSA key',
  ec: 'an elliptic-curve (ECDSA) key',
  ed448: 'an Ed448 key',
  x25519: 'an X25519 key',
  x448: 'an X448 key',
  dh: 'a Diffie-Hellman key',
};

function loadEd25519PrivateKey(privateKey) {
  if (privateKey instanceof crypto.KeyObject) return checkKeyObject(privateKey);
  let pem;
  if (typeof privateKey === 'string') {
    pem = privateKey;
  } else if (Buffer.isBuffer(privateKey) || privateKey instanceof Uint8Array) {
    pem = Buffer.from(privateKey).toString('latin1'); // PEM is ASCII; anything else fails below
  } else {
    throw new TypeError(`${NOT_A_PRIVATE_KEY}, not ${kindOfValue(privateKey)}`);
  }
  if (!pem.includes('-----BEGIN')) {
    throw new TypeError(`${NOT_A_PRIVATE_KEY}; this is not PEM text`);
  }
  if (pem.includes('PUBLIC KEY-----') && !pem.includes('PRIVATE KEY-----')) {
    throw new TypeError(PUBLIC_KEY_GIVEN);
  }
  if (pem.includes('ENCRYPTED PRIVATE KEY-----') || pem.includes('Proc-Type: 4,ENCRYPTED')) {
    throw new TypeError('privateKey is an encrypted PEM: give the unencrypted PKCS#8 PEM ' +
      '(or a KeyObject made with its passphrase)');
  }
  let key;
  try {
    key = crypto.createPrivateKey({ key: pem, format: 'pem' });
  } catch {
    // OpenSSL's own text is replaced, never chained: the reader gets one clear sentence.
    throw new TypeError(`${NOT_A_PRIVATE_KEY}; this PEM could not be read`);
  }
  return checkKeyObject(key);
}

function checkKeyObject(key) {
  if (key.type !== 'private') throw new TypeError(PUBLIC_KEY_GIVEN);
  if (key.asymmetricKeyType !== 'ed25519') {
    const kind = KIND_NAMES[key.asymmetricKeyType] || 'not an Ed25519 key';
    throw new TypeError(`privateKey is ${kind}; the ed25519 scheme needs an Ed25519 key`);
  }
  return key;
}

function kindOfValue(value) {
  if (value === null) return 'null';
  if (typeof value === 'object') return `an object (${value.constructor?.name ?? 'no prototype'})`;
  return `a ${typeof value}`;
}

// A fresh key pair. privateKeyPem is not enumerable, so console.log and JSON.stringify of the
// pair leave it out; destructuring still reads it.
function generateEd25519KeyPair() {
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ed25519');
  const pair = {
    publicKey: Buffer.from(publicKey.export({ format: 'jwk' }).x, 'base64url').toString('base64'),
    publicKeyPem: publicKey.export({ type: 'spki', format: 'pem' }),
  };
  Object.defineProperty(pair, 'privateKeyPem', {
    value: privateKey.export({ type: 'pkcs8', format: 'pem' }),
    enumerable: false,
  });
  return Object.freeze(pair);
}

module.exports = { generateEd25519KeyPair, loadEd25519PrivateKey };
