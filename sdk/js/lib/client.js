'use strict';
// The client of tenant backends: the Python SDK's Client, method for method, with camelCase
// names and results. Retries and errors live in ./transport.

const crypto = require('node:crypto');
const { inspect } = require('node:util');

const { Blocked, ServiceError } = require('./errors');
const { Transport } = require('./transport');

// A key is sent as a header: refusing anything else here keeps fetch from quoting it in an error.
const PRINTABLE = /^[\x21-\x7e]+$/;
const MAX_TIMER = 2 ** 31 - 1;

class Client {
  #transport;

  constructor(baseUrl, {
    apiKey, timeout = 30000, retries = 3, backoffBase = 500, backoffCap = 8000,
    fetch = globalThis.fetch,
  } = {}) {
    if (!isHttpUrl(baseUrl)) throw new TypeError('baseUrl must be an http:// or https:// URL');
    if (typeof apiKey !== 'string' || !PRINTABLE.test(apiKey)) {
      throw new TypeError('apiKey must be a non-empty string of printable ASCII');
    }
    // A timeout of 0 would abort every attempt at once. Node's timers take at most 2^31-1 ms
    // (past it they fire after 1 ms); a fraction (3000.0000000000005 from arithmetic) is
    // rounded up to whole milliseconds.
    for (const [name, value, least] of [['timeout', timeout, 1], ['backoffBase', backoffBase, 0],
      ['backoffCap', backoffCap, 0]]) {
      if (typeof value !== 'number' || !Number.isFinite(value) || value < least
          || value > MAX_TIMER) {
        throw new TypeError(`${name} must be a number of milliseconds from ${least} to `
          + `${MAX_TIMER}`);
      }
    }
    if (!Number.isInteger(retries) || retries < 0) {
      throw new TypeError('retries must be an integer of at least 0');
    }
    if (typeof fetch !== 'function') throw new TypeError('fetch must be a function');
    this.#transport = new Transport({
      baseUrl: baseUrl.replace(/\/+$/, ''), apiKey, timeout: Math.ceil(timeout), retries,
      backoffBase, backoffCap, fetch,
    });
  }

  /** The key this client sends; rotateKey replaces it. A getter, so logging the client does
   *  not print it. */
  get apiKey() {
    return this.#transport.apiKey;
  }

  // -- the API ---------------------------------------------------------------------------------

  async generate(userToken, options) {
    const { ttl } = optionsOf(options, 'generate', '{ ttl }');
    const body = await this.#call('POST', '/v1/intent/generate',
      { json: { user_token: userToken, ...given({ ttl }) },
        expect: ['intent_hash', 'intent_class', 'expires_at'] });
    return { intentHash: body.intent_hash, intentClass: body.intent_class,
      expiresAt: body.expires_at };
  }

  /** One Idempotency-Key for all attempts (a fresh one per call unless given), so a retry after
   *  a lost answer gets the first verdict back instead of `ReplayedIntent`. */
  async verify(intentHash, response, options) {
    const { idempotencyKey } = optionsOf(options, 'verify', '{ idempotencyKey }');
    return (await this.#verify(intentHash, response, idempotencyKey)).result;
  }

  /** The verdict and the X-Request-Id it came with (which guard's Blocked carries). */
  async #verify(intentHash, response, idempotencyKey) {
    const { body, headers, status } = await this.#transport.request('POST', '/v1/intent/verify', {
      headers: { 'Idempotency-Key': idempotencyKey ?? crypto.randomUUID().replace(/-/g, '') },
      json: { original_intent_hash: intentHash, response },
      expect: ['cleared', 'reason', 'payload'],
    });
    // A verdict is the service's only in its own shape: a gate never takes "false" or 1 for
    // cleared (a proxy's or a hostile answer), it throws.
    // Cleared is a payload and no reason, blocked a reason and no payload: nothing else.
    if (!(body.cleared === true && body.reason === null && isObject(body.payload))
        && !(body.cleared === false && typeof body.reason === 'string' && body.payload === null)) {
      throw new ServiceError(`the service answered ${status} without a verdict`,
        { status, requestId: headers.get('X-Request-Id') });
    }
    return { result: { cleared: body.cleared, reason: body.reason, payload: body.payload,
      replayed: headers.get('Idempotent-Replayed') === 'true' },
    requestId: headers.get('X-Request-Id') };
  }

  /** generate, then `callAi(intentHash)` (your call to the AI service, resolving to its signed
   *  answer), then verify: resolves to the cleared payload, or rejects with Blocked. */
  async guard(userToken, callAi, options) {
    const { ttl } = optionsOf(options, 'guard', '{ ttl }');
    const { intentHash } = await this.generate(userToken, { ttl });
    const { result, requestId } = await this.#verify(intentHash, await callAi(intentHash));
    if (result.cleared !== true) throw new Blocked(result.reason, result, { requestId });
    return result.payload;
  }

  async usage() {
    const body = await this.#call('GET', '/v1/tenant/usage',
      { expect: ['email', 'plan', 'usage_count', 'rate_limit', 'remaining'] });
    return { email: body.email, plan: body.plan, usageCount: body.usage_count,
      rateLimit: body.rate_limit, remaining: body.remaining };
  }

  /** Rotate the key; this client uses the new one from then on. Retried only when the request
   *  could not be sent: once the service has rotated, the old key is dead and a retry could only
   *  get 401, losing the new key. */
  async rotateKey() {
    const body = await this.#call('POST', '/v1/tenant/rotate-key',
      { json: {}, unsentOnly: true, expect: ['new_key', 'message'] });
    this.#transport.apiKey = body.new_key;
    const rotation = { newKey: body.new_key, message: body.message };
    // A live key: console.log and util.inspect leave it out (as the Python SDK's repr does),
    // JSON keeps it, so the result can still be stored.
    Object.defineProperty(rotation, inspect.custom, {
      value: () => `KeyRotation { message: ${inspect(rotation.message)} }` });
    return rotation;
  }

  // -- self-service --------------------------------------------------------------------------
  // Creating and revoking are retried only when the request could not be sent: a retry of a
  // creation that went through would make a second key.

  async createKey(name, options) {
    const { expiresIn, scopes } = optionsOf(options, 'createKey', '{ expiresIn, scopes }');
    const json = { name, ...given({ expires_in: expiresIn, scopes }) };
    return camelCase(await this.#call('POST', '/v1/tenant/keys', { json, unsentOnly: true }));
  }

  async listKeys() {
    return this.#list('GET', '/v1/tenant/keys', 'keys');
  }

  async revokeKey(keyId) {
    return camelCase(await this.#call('DELETE', `/v1/tenant/keys/${segment(keyId)}`,
      { unsentOnly: true }));
  }

  /** Register the AI service's Ed25519 public key (base64 of 32 bytes, or PEM). */
  async addSigningKey(publicKey, options) {
    const { name, expiresIn } = optionsOf(options, 'addSigningKey', '{ name, expiresIn }');
    const json = { public_key: publicKey, ...given({ name, expires_in: expiresIn }) };
    return camelCase(await this.#call('POST', '/v1/tenant/signing-keys',
      { json, unsentOnly: true }));
  }

  async listSigningKeys() {
    return this.#list('GET', '/v1/tenant/signing-keys', 'signing_keys');
  }

  async revokeSigningKey(keyId) {
    return camelCase(await this.#call('DELETE', `/v1/tenant/signing-keys/${segment(keyId)}`,
      { unsentOnly: true }));
  }

  /** Switch to 'bound', 'payload' or 'ed25519'; the previous scheme verifies `graceSeconds`
   *  more. */
  async setSignatureScheme(scheme, options) {
    const { graceSeconds = 0 } = optionsOf(options, 'setSignatureScheme', '{ graceSeconds }');
    return camelCase(await this.#call('PUT', '/v1/tenant/signature-scheme',
      { json: { scheme, grace_seconds: graceSeconds } }));
  }

  async auditLog(options) {
    const { limit = 50, before } = optionsOf(options, 'auditLog', '{ limit, before }');
    const query = new URLSearchParams({ limit: String(limit) });
    if (before !== undefined && before !== null) query.set('before', String(before));
    return this.#list('GET', `/v1/tenant/audit-log?${query}`, 'entries');
  }

  async dailyUsage(options) {
    const { days = 30 } = optionsOf(options, 'dailyUsage', '{ days }');
    const query = new URLSearchParams({ days: String(days) });
    return this.#list('GET', `/v1/tenant/usage/daily?${query}`, 'days');
  }

  async #call(method, path, options) {
    return (await this.#transport.request(method, path, options)).body;
  }

  /** The answer's list of records (`member`), in camelCase: anything else is not the service's
   *  answer (a proxy's, a hostile one), a ServiceError rather than a TypeError from `map`. */
  async #list(method, path, member) {
    const { body, headers, status } = await this.#transport.request(method, path,
      { expect: [member] });
    const records = body[member];
    if (!Array.isArray(records) || !records.every(isObject)) {
      throw new ServiceError(`the service answered ${status} without a list of ${member}`,
        { status, requestId: headers.get('X-Request-Id') });
    }
    return records.map(camelCase);
  }
}

/** Whether fetch can take `value` + a path: a malformed URL would otherwise fail in fetch, where
 *  it looks like a network failure and is retried. As the Python SDK judges it: a host right
 *  after the `//`, port 0 refused, no space or control character anywhere (the URL parser
 *  drops a line break from an environment file, fetch then fails at every call) and no
 *  credentials (fetch refuses them, quoting the URL). */
function isHttpUrl(value) {
  if (typeof value !== 'string' || /[\x00-\x20\x7f]/.test(value)
      || !/^https?:\/\/[^/?#\\@]/i.test(value)) {
    return false;
  }
  try {
    const url = new URL(value);
    return /^https?:$/.test(url.protocol) && url.hostname !== '' && url.port !== '0'
      && url.username === '' && url.password === '';
  } catch {
    return false;
  }
}

/** A method's options: an object or nothing. A plain value in its place (Python's positional
 *  argument, `setSignatureScheme('ed25519', 3600)`) would otherwise be read as no options at
 *  all, and the grace, the ttl or the Idempotency-Key quietly left out. */
function optionsOf(options, method, names) {
  if (options === undefined) return {};
  if (!isObject(options)) {
    throw new TypeError(`${method}'s options must be an object, such as ${names}`);
  }
  return options;
}

/** A JSON object: not null, not an array. */
function isObject(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** The members whose value was given (not undefined or null), as the Python SDK leaves out
 *  what is None. */
function given(members) {
  return Object.fromEntries(Object.entries(members)
    .filter(([, value]) => value !== undefined && value !== null));
}

/** A record's own names in camelCase (`created_at` → `createdAt`); values are left as they are,
 *  so the block reasons that name a day's counts keep their names. */
function camelCase(record) {
  return Object.fromEntries(Object.entries(record)
    .map(([name, value]) => [name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase()),
      value]));
}

const segment = (id) => encodeURIComponent(String(id));

module.exports = { Client };
