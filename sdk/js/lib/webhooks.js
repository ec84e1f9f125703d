'use strict';
// Receiving the service's webhooks: verify an incoming event before trusting it, as the Python
// SDK's WebhookReceiver does. Events are Standard Webhooks (standardwebhooks.com): `v1,` +
// base64 HMAC-SHA256 over `id.timestamp.body`, keyed with the base64-decoded part of the
// endpoint secret `whsec_...`; during a secret rotation the service sends two signatures, and
// either verifies. A webhook-timestamp more than five minutes away is refused, against replays.
// Deduplicate by the event's `id` (the webhook-id, the same on every attempt): delivery is at
// least once. Written on node:crypto, so the package keeps no dependency.

const crypto = require('node:crypto');

const TOLERANCE_SECONDS = 5 * 60;
const SECRET_PREFIX = 'whsec_';
// Standard base64 only: Buffer.from would skip any other character and decode the rest.
const STANDARD_BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

/** The request is not an event the service signed with this secret (or it came too late). */
class WebhookVerificationError extends Error {
  constructor(message) {
    super(message);
    this.name = 'WebhookVerificationError';
  }
}

/** Return the event (`{id, type, timestamp, data}`), or throw WebhookVerificationError.
 *  `body`: the raw request body exactly as received (a string, Buffer or Uint8Array: not a
 *  parsed object, whose bytes are lost); `headers`: Node's request.headers, a fetch Headers
 *  or any object of header names. */
function verifyWebhook(secret, body, headers, { now = Date.now() / 1000 } = {}) {
  const key = secretKey(secret);
  const id = header(headers, 'webhook-id');
  const timestamp = header(headers, 'webhook-timestamp');
  const signatures = header(headers, 'webhook-signature');
  if (!/^[0-9]{1,15}$/.test(timestamp)) {
    throw new WebhookVerificationError('webhook-timestamp is not a Unix time in seconds');
  }
  if (Math.abs(now - Number(timestamp)) > TOLERANCE_SECONDS) {
    throw new WebhookVerificationError('webhook-timestamp is more than five minutes away');
  }
  const bytes = bodyBytes(body);
  const expected = crypto.createHmac('sha256', key)
    .update(Buffer.concat([Buffer.from(`${id}.${timestamp}.`, 'utf8'), bytes])).digest();
  const matches = signatures.split(' ').some((entry) => {
    const [version, signature] = entry.split(',', 2);
    if (version !== 'v1' || !STANDARD_BASE64.test(signature ?? '')) return false;
    const given = Buffer.from(signature, 'base64');
    return given.length === expected.length && crypto.timingSafeEqual(given, expected);
  });
  if (!matches) throw new WebhookVerificationError('no signature matches');
  let event;
  try {
    event = JSON.parse(bytes.toString('utf8'));
  } catch {
    throw new WebhookVerificationError('the event is not JSON');
  }
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    throw new WebhookVerificationError('the event is not a JSON object');
  }
  return { id, ...event };
}

function secretKey(given) {
  // Trimmed: a secret read from a file or a mounted secret often ends with a line break.
  const secret = typeof given === 'string' ? given.trim() : given;
  if (typeof secret !== 'string' || !secret.startsWith(SECRET_PREFIX)
      || !STANDARD_BASE64.test(secret.slice(SECRET_PREFIX.length))) {
    // A mistake of the receiver's, not of the request: a TypeError, as for the Client's options.
    throw new TypeError("secret must be the endpoint's whsec_... secret");
  }
  return Buffer.from(secret.slice(SECRET_PREFIX.length), 'base64');
}

function header(headers, name) {
  let value;
  if (headers && typeof headers.get === 'function') {
    value = headers.get(name);
  } else if (headers && typeof headers === 'object') {
    const found = Object.keys(headers).find((key) => key.toLowerCase() === name);
    value = found === undefined ? undefined : headers[found];
  }
  if (typeof value !== 'string' || value === '') {
    throw new WebhookVerificationError(`${name} is missing`);
  }
  return value;
}

function bodyBytes(body) {
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  throw new TypeError('body must be the raw request body: a string, Buffer or Uint8Array');
}

module.exports = { WebhookVerificationError, verifyWebhook };
