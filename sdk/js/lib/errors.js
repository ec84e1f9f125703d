'use strict';
// Typed errors of the client: each carries the service's error text (`message`), the HTTP
// `status`, the `requestId` to quote to the service's operators, and the error `body`.
// The same hierarchy as the Python SDK's intentgate.errors.

class IntentGateError extends Error {
  constructor(message, { status = null, requestId = null, body = {}, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.status = status;
    this.requestId = requestId;
    this.body = body;
  }

  toString() {
    // What is known of it: a Blocked verdict has a request id but no error status.
    const where = [this.status && `status ${this.status}`,
      this.requestId && `request ${this.requestId}`].filter(Boolean).join(', ');
    return `${this.name}: ${this.message}${where ? ` (${where})` : ''}`;
  }
}

/** 401 or 403: the key is missing, wrong, rotated, deactivated, or lacks a scope. */
class AuthenticationError extends IntentGateError {}

/** 400, 413, 415 or 422: refused as it stands, so a retry will not help. Also, with no status
 *  and nothing sent, a request that cannot be sent (a body without a JSON form). */
class ValidationError extends IntentGateError {}

/** 429 `rate limit exceeded`: wait `retryAfter` seconds. */
class RateLimitError extends IntentGateError {
  constructor(message, { retryAfter = null, ...details } = {}) {
    super(message, details);
    this.retryAfter = retryAfter;
  }
}

/** 429 `monthly verification limit reached`: the plan's month is used up. */
class QuotaExceededError extends RateLimitError {}

/** A 5xx, or a network failure, that lasted through every retry. `maybeSent` is false only when
 *  no connection could be opened, so the service never saw the request. */
class ServiceError extends IntentGateError {
  constructor(message, { maybeSent = true, ...details } = {}) {
    super(message, details);
    this.maybeSent = maybeSent;
  }
}

/** The gate blocked the AI's answer (thrown by guard only): do not show it to the user.
 *  `requestId` is the verify's, to quote to the service's operators as with any error. */
class Blocked extends IntentGateError {
  constructor(reason, result = null, { requestId = null } = {}) {
    super(`AI response blocked: ${reason}`, { requestId });
    this.reason = reason;
    this.result = result;
  }
}

module.exports = {
  AuthenticationError,
  Blocked,
  IntentGateError,
  QuotaExceededError,
  RateLimitError,
  ServiceError,
  ValidationError,
};
