'use strict';
// The intent verification service from Node: the Client of tenant backends (generate, verify,
// guard, usage, key rotation, self-service), the signers of AI services (HMAC and Ed25519
// over RFC 8785 canonical JSON) and the check of the service's webhooks. No dependency beyond
// Node's own fetch and node:crypto.

const { INTEGER_RANGE_MESSAGE, canonicalize } = require('./lib/canonicalize');
const { Client } = require('./lib/client');
const errors = require('./lib/errors');
const { generateEd25519KeyPair } = require('./lib/keys');
const { signResponse, signResponseEd25519, signingMessage } = require('./lib/signing');
const { WebhookVerificationError, verifyWebhook } = require('./lib/webhooks');

module.exports = {
  ...errors, // every typed error, as lib/errors.js exports it
  Client,
  INTEGER_RANGE_MESSAGE,
  canonicalize,
  generateEd25519KeyPair,
  signResponse,
  signResponseEd25519,
  signingMessage,
  verifyWebhook,
  WebhookVerificationError,
};
// index.d.ts declares a default export (index.mjs has one): require('intentgate').default is the
// same object, so TypeScript compiled to CommonJS finds at run time what its types promise.
module.exports.default = module.exports;
