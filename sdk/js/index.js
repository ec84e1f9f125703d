'use strict';
// Signers for the intent verification service's AI responses (HMAC and Ed25519) and the
// RFC 8785 canonical JSON they sign. No dependency beyond node:crypto.

const { INTEGER_RANGE_MESSAGE, canonicalize } = require('./lib/canonicalize');
const { generateEd25519KeyPair } = require('./lib/keys');
const { signResponse, signResponseEd25519, signingMessage } = require('./lib/signing');

module.exports = {
  INTEGER_RANGE_MESSAGE,
  canonicalize,
  generateEd25519KeyPair,
  signResponse,
  signResponseEd25519,
  signingMessage,
};
