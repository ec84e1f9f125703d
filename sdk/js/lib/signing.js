'use strict';
// The response signature of the intent verification service (its CONTRACT, Verify):
//   bound (default): message = `${intentHash}.${matchId}.${timestamp}.` + JCS(payload)
//   payload:         message = JCS(payload)
//   HMAC schemes:  signature = hex(HMAC-SHA256(UTF-8 bytes of the whole secret, message))
//   ed25519:       signature = base64(Ed25519(privateKey, message)), the bound message
// with JCS = RFC 8785 and the message as UTF-8 bytes.

const crypto = require('node:crypto');
const { LONE_SURROGATE, canonicalizeForSigning } = require('./canonicalize');
const { loadEd25519PrivateKey } = require('./keys');

const SCHEMES = ['bound', 'payload'];

function signingMessage(intentHash, matchId, timestamp, payload, { scheme = 'bound' } = {}) {
  if (!SCHEMES.includes(scheme)) throw new TypeError("scheme must be 'bound' or 'payload'");
  const canonical = canonicalizeForSigning(payload);
  if (!canonical.startsWith('{')) throw new TypeError('payload must be a JSON object');
  if (scheme === 'payload') return canonical;
  requireText(intentHash, 'intentHash');
  requireText(matchId, 'matchId');
  if (!Number.isSafeInteger(timestamp)) {
    throw new TypeError('timestamp must be an integer number of Unix seconds');
  }
  return `${intentHash}.${matchId}.${timestamp}.${canonical}`;
}

function signResponse(secret, intentHash, matchId, timestamp, payload, options) {
  if (typeof secret !== 'string' || secret.length === 0 || LONE_SURROGATE.test(secret)) {
    throw new TypeError('secret must be the signing secret string (sig_live_...)');
  }
  const message = signingMessage(intentHash, matchId, timestamp, payload, options);
  return crypto.createHmac('sha256', Buffer.from(secret, 'utf8'))
    .update(message, 'utf8')
    .digest('hex');
}

function signResponseEd25519(privateKey, intentHash, matchId, timestamp, payload) {
  const key = loadEd25519PrivateKey(privateKey);
  const message = signingMessage(intentHash, matchId, timestamp, payload);
  return crypto.sign(null, Buffer.from(message, 'utf8'), key).toString('base64');
}

function requireText(value, name) {
  if (typeof value !== 'string' || value.length === 0) {
    throw new TypeError(`${name} must be a non-empty string`);
  }
  if (LONE_SURROGATE.test(value)) throw new TypeError(`${name} must be valid Unicode`);
}

module.exports = { signResponse, signResponseEd25519, signingMessage };
