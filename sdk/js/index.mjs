// The ES module face of index.js (one implementation for require() and import, so an error
// class is the same class whichever way it was loaded).
import intentgate from './index.js';

export const {
  AuthenticationError,
  Blocked,
  Client,
  INTEGER_RANGE_MESSAGE,
  IntentGateError,
  QuotaExceededError,
  RateLimitError,
  ServiceError,
  ValidationError,
  canonicalize,
  generateEd25519KeyPair,
  signResponse,
  signResponseEd25519,
  signingMessage,
  verifyWebhook,
  WebhookVerificationError,
} = intentgate;
export default intentgate;
