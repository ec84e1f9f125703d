'use strict';
// One call to the service, retried as the service specification says and as the Python SDK
// does: 5xx answers and network failures up to `retries` times with exponential backoff and
// full jitter (a `Retry-After` from the service wins), 4xx answers never.

const {
  AuthenticationError,
  IntentGateError,
  QuotaExceededError,
  RateLimitError,
  ServiceError,
  ValidationError,
} = require('./errors');

const QUOTA_TEXT = 'monthly verification limit reached';
// The longest Retry-After (seconds) a 5xx is retried after. A longer one would hold the caller
// for hours, or past setTimeout's 2^31-1 ms, where Node waits 1 ms instead; waiting less would
// not honour it. The error is thrown at once instead and the caller decides, as after a 429.
// The Python SDK's MAX_RETRY_AFTER.
const MAX_RETRY_AFTER = 60;

// Failures to open the connection: only these prove the request never reached the service.
// Anything later (a reset, a closed or garbled answer, a timeout, a TLS failure) may have come
// after the service acted. Judged by the error's code, never by its text, which differs between
// systems and may partly come from the other end.
const UNSENT_CODES = new Set([
  'ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EAI_FAIL', 'ENETUNREACH', 'EHOSTUNREACH',
  'EADDRNOTAVAIL', 'UND_ERR_CONNECT_TIMEOUT',
]);

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** `work(signal)`, given `ms` milliseconds: then the signal aborts it, and the call rejects with
 *  a TimeoutError even when what `work` awaits ignores the abort. Node 20's fetch does: the body
 *  of an answer that fails to decompress, when it arrives after the headers, never settles. The
 *  timer is a plain one, keeping the process alive till then; AbortSignal.timeout's is not, and
 *  a process with nothing else to do ended with the call neither resolved nor rejected. */
async function within(ms, work) {
  const controller = new AbortController();
  let timer;
  const expired = new Promise((resolve, reject) => {
    timer = setTimeout(() => {
      const error = new DOMException(`the attempt took more than ${ms} ms`, 'TimeoutError');
      controller.abort(error);
      reject(error);
    }, ms);
  });
  try {
    return await Promise.race([work(controller.signal), expired]);
  } finally {
    clearTimeout(timer);
  }
}

class Transport {
  constructor({ baseUrl, apiKey, timeout, retries, backoffBase, backoffCap, fetch }) {
    Object.assign(this, { baseUrl, timeout, retries, backoffBase, backoffCap });
    this.fetch = fetch;
    this.apiKey = apiKey;
  }

  /** Send one request; resolve to {body, headers} or reject with a typed error.
   *  `unsentOnly`: retry only failures that prove the request was not sent (see UNSENT_CODES),
   *  for calls whose repetition would do harm once the first went through. `expect`: the
   *  members the caller reads; an answer without one is a ServiceError. */
  async request(method, path, { headers = {}, json, unsentOnly = false, expect = [] } = {}) {
    // Redirects are not followed: the service never redirects, and fetch would send
    // X-Service-Key and the body (a user token) on to any Location's origin.
    const init = { method, headers: { ...headers, 'X-Service-Key': this.apiKey },
      redirect: 'manual' };
    if (json !== undefined) {
      init.body = jsonBody(json);
      init.headers['Content-Type'] = 'application/json';
    }
    checkHeaders(headers);
    for (let attempt = 0; ; attempt += 1) {
      let http;
      let text;
      try {
        ({ http, text } = await within(this.timeout, async (signal) => {
          const response = await this.fetch(this.baseUrl + path, { ...init, signal });
          // Inside the deadline: the answer can be cut off, or never end, too.
          return { http: response, text: await response.text() };
        }));
      } catch (error) {
        if (!isNetworkFailure(error)) throw error;
        const sent = !UNSENT_CODES.has(failureCode(error));
        if (attempt >= this.retries || (unsentOnly && sent)) {
          throw new ServiceError(`network failure: ${failureCode(error) || error.name}`,
            { maybeSent: sent, cause: error });
        }
        await sleep(this.backoff(attempt));
        continue;
      }
      const wait = retryAfter(http);
      if (http.status >= 500 && attempt < this.retries && !unsentOnly
          && (wait === null || wait <= MAX_RETRY_AFTER)) {
        await sleep(this.backoff(attempt, wait));
        continue;
      }
      return { body: members(answer(http, text), http, expect), headers: http.headers,
        status: http.status };
    }
  }

  /** Milliseconds to wait before retry number `attempt + 1`. */
  backoff(attempt, retryAfterSeconds = null) {
    if (retryAfterSeconds !== null) return retryAfterSeconds * 1000;
    return Math.random() * Math.min(this.backoffCap, this.backoffBase * 2 ** attempt);
  }
}

/** The request body as JSON text, or a ValidationError before anything is sent: NaN and the
 *  infinities have no JSON form (JSON.stringify would quietly send null), nor have BigInt
 *  values and circular structures. */
function jsonBody(value) {
  try {
    return JSON.stringify(value, (key, member) => {
      if (typeof member === 'number' && !Number.isFinite(member)) {
        throw new RangeError(`${member} has no JSON form`);
      }
      return member;
    });
  } catch (error) {
    throw new ValidationError(`request body cannot be sent as JSON: ${error.message}`);
  }
}

/** Refuse a header fetch would refuse, without echoing it: fetch's own error quotes the value.
 *  A space at either end too: fetch strips it, and a different value would be sent (another
 *  Idempotency-Key's stored verdict answered), as the Python SDK refuses it. */
function checkHeaders(headers) {
  for (const [name, value] of Object.entries(headers)) {
    if (typeof value !== 'string' || !/^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/.test(value)) {
      throw new ValidationError(`${name} must be a non-empty string of printable ASCII, `
        + 'without a space at either end');
    }
  }
}

/** Whether fetch failed on the network (undici's TypeError with a cause, a timeout) rather than
 *  on a mistake of the caller's, which is thrown as it is. */
function isNetworkFailure(error) {
  if (!(error instanceof Error)) return false;
  if (error.name === 'TimeoutError' || error.name === 'AbortError') return true;
  return (error instanceof TypeError && error.cause !== undefined)
    || typeof error.code === 'string';
}

function failureCode(error) {
  for (let cause = error; cause instanceof Error; cause = cause.cause) {
    if (typeof cause.code === 'string') return cause.code;
  }
  return undefined;
}

function retryAfter(http) {
  const value = http.headers.get('Retry-After');
  return value && /^\d+$/.test(value) ? Number(value) : null;
}

/** The parsed answer, or the typed error its status stands for. */
function answer(http, text) {
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  const requestId = (body && body.request_id) || http.headers.get('X-Request-Id');
  if (http.status >= 300 && http.status < 400) {
    throw new IntentGateError(`the service answered ${http.status}, a redirect, which is not `
      + 'followed', { status: http.status, requestId });
  }
  if (http.status < 400) {
    if (body !== null && typeof body === 'object' && !Array.isArray(body)) return body;
    throw new ServiceError(`the service answered ${http.status} without a JSON object`,
      { status: http.status, requestId });
  }
  body = body !== null && typeof body === 'object' ? body : {};
  const message = body.error || `HTTP ${http.status}`;
  const details = { status: http.status, requestId, body };
  if (http.status === 401 || http.status === 403) throw new AuthenticationError(message, details);
  if (http.status === 429) {
    const RateError = message === QUOTA_TEXT ? QuotaExceededError : RateLimitError;
    throw new RateError(message, { retryAfter: retryAfter(http), ...details });
  }
  if (http.status >= 500) throw new ServiceError(message, details);
  if ([400, 413, 415, 422].includes(http.status)) throw new ValidationError(message, details);
  throw new IntentGateError(message, details);
}

/** `body`, or a ServiceError when a member the call reads is missing: a JSON object that is not
 *  the service's answer (a proxy's `{}`, say) would otherwise give undefined fields, a
 *  TypeError in `.map`, or a rotateKey that takes undefined for the new key. */
function members(body, http, expect) {
  const missing = expect.filter((name) => !Object.hasOwn(body, name));
  if (missing.length > 0) {
    throw new ServiceError(`the service answered ${http.status} without ${missing.join(', ')}`,
      { status: http.status, requestId: http.headers.get('X-Request-Id') });
  }
  return body;
}

module.exports = { Transport };
