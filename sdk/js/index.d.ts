import type { KeyObject } from 'node:crypto';

/** Any value JSON.stringify can write; objects are read as JSON.stringify reads them. */
export type JsonValue =
  null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

export interface SignOptions {
  /** `bound` (the default) signs `${intentHash}.${matchId}.${timestamp}.` + JCS(payload);
   *  `payload` signs JCS(payload) alone, for tenants set to the payload scheme. */
  scheme?: 'bound' | 'payload';
}

export interface Ed25519KeyPair {
  /** PKCS#8 PEM. Keep it on the AI service; it is not enumerable, so logging the pair omits it. */
  readonly privateKeyPem: string;
  /** Base64 of the 32 raw bytes: register it with the service. */
  readonly publicKey: string;
  /** The same public key as PEM SubjectPublicKeyInfo (the service accepts either). */
  readonly publicKeyPem: string;
}

/** The contract's refusal text for integers beyond ±(2^53-1). */
export const INTEGER_RANGE_MESSAGE: string;

/** RFC 8785 canonical JSON. Throws RangeError for NaN and infinities, TypeError for lone
 *  surrogates, BigInt, circular structures and values with no JSON form. */
export function canonicalize(value: unknown): string;

/** The exact text that is signed (its UTF-8 bytes are what the signature covers). */
export function signingMessage(intentHash: string, matchId: string, timestamp: number,
                               payload: object, options?: SignOptions): string;

/** HMAC-SHA256 with the UTF-8 bytes of the whole secret as key: 64 lowercase hex characters.
 *  Throws RangeError for integer-valued numbers beyond ±(2^53-1) that JSON would carry as
 *  integers (send them as strings). */
export function signResponse(secret: string, intentHash: string, matchId: string,
                             timestamp: number, payload: object, options?: SignOptions): string;

/** Ed25519 over the bound message: standard base64, 88 characters. `privateKey` is PKCS#8 PEM
 *  (string or Buffer) or a private KeyObject; anything else is a TypeError. */
export function signResponseEd25519(privateKey: string | Buffer | Uint8Array | KeyObject,
                                    intentHash: string, matchId: string, timestamp: number,
                                    payload: object): string;

/** A fresh Ed25519 key pair. */
export function generateEd25519KeyPair(): Ed25519KeyPair;

// -- the client of tenant backends ------------------------------------------------------------

export type JsonObject = { [key: string]: JsonValue };

/** What the AI service returns for an intent, signed, in its wire names (as a signer makes it). */
export interface ScaleResponse {
  match_id: string;
  payload: object;
  timestamp: number;
  signature: string;
}

export type IntentClass =
  'commerce' | 'infrastructure' | 'wellness' | 'finance' | 'education' | 'social' | 'other';

export type BlockReason = 'UnknownIntent' | 'ExpiredIntent' | 'ReplayedIntent'
  | 'InvalidSignature' | 'TimestampOutOfWindow' | 'ReplayedResponse';

export type Scope = 'intents' | 'usage:read' | 'keys:write' | 'signing:write' | 'webhooks:write';

export type SignatureScheme = 'bound' | 'payload' | 'ed25519';

/** The part of fetch the client uses: Node's own by default, or yours (a proxy, a private CA
 *  through an undici dispatcher, a test double). */
export type Fetch = (url: string, init: {
  method: string;
  headers: Record<string, string>;
  body?: string;
  /** Always 'manual': a redirect is answered as an IntentGateError, never followed. */
  redirect: 'manual';
  signal: AbortSignal;
}) => Promise<{ status: number; headers: { get(name: string): string | null };
  text(): Promise<string> }>;

export interface ClientOptions {
  /** `key_live_...`: sent in X-Service-Key. */
  apiKey: string;
  /** Milliseconds one attempt may take, answer included (default 30000; 1 to 2^31-1). */
  timeout?: number;
  /** Retries of 5xx answers and network failures (default 3: four attempts in all). */
  retries?: number;
  /** Backoff ceiling of the first retry in milliseconds, doubling each time (default 500). */
  backoffBase?: number;
  /** Largest backoff ceiling in milliseconds (default 8000). */
  backoffCap?: number;
  fetch?: Fetch;
}

export interface IntentSignature {
  intentHash: string;
  intentClass: IntentClass;
  /** Unix seconds. */
  expiresAt: number;
}

/** Cleared: the payload may be shown. Blocked: the reason, and the answer must not be shown.
 *  `replayed`: an idempotent replay of an earlier verdict (nothing counted twice). */
export type VerificationResult =
  | { cleared: true; reason: null; payload: JsonObject; replayed: boolean }
  | { cleared: false; reason: BlockReason; payload: null; replayed: boolean };

export interface Usage {
  email: string;
  plan: string;
  usageCount: number;
  /** The plan's monthly verifications; null on unlimited plans. */
  rateLimit: number | null;
  remaining: number | null;
}

export interface KeyRotation {
  newKey: string;
  message: string;
}

export interface ApiKey {
  id: string;
  name: string;
  /** The key's first characters, to tell keys apart. */
  prefix: string;
  /** Where the service reports scopes. */
  scopes?: Scope[];
  createdAt: number;
  expiresAt: number | null;
}

export interface CreatedApiKey extends ApiKey {
  /** The key itself: shown this once. */
  apiKey: string;
}

export interface RevokedApiKey extends ApiKey {
  revokedAt: number;
}

export interface SigningKey {
  id: string;
  name: string | null;
  fingerprint?: string;
  createdAt: number;
  expiresAt: number | null;
}

export interface RevokedSigningKey extends SigningKey {
  revokedAt: number;
}

export interface SignatureSchemeState {
  scheme: SignatureScheme;
  previousScheme: SignatureScheme | null;
  /** Unix seconds until which the previous scheme still verifies. */
  previousValidUntil: number | null;
}

export interface AuditEntry {
  /** Per tenant; the `before` cursor of the next page. */
  id: number;
  at: number;
  action: string;
  /** key:<prefix>, admin:<admin key name>, or cli. */
  actor: string;
  requestId: string | null;
  address: string | null;
  /** Ids, prefixes, plans, as the service writes them: never a secret. */
  details: JsonObject;
}

export interface UsageDay {
  /** YYYY-MM-DD, UTC. */
  date: string;
  verifications: number;
  cleared: number;
  /** Blocked verifications by reason. */
  blocked: { [reason: string]: number };
}

export class Client {
  constructor(baseUrl: string, options: ClientOptions);
  /** The key this client sends; rotateKey replaces it. */
  readonly apiKey: string;
  generate(userToken: string, options?: { ttl?: number }): Promise<IntentSignature>;
  verify(intentHash: string, response: ScaleResponse,
         options?: { idempotencyKey?: string }): Promise<VerificationResult>;
  /** generate, then `callAi(intentHash)`, then verify: the cleared payload, or Blocked. */
  guard(userToken: string,
        callAi: (intentHash: string) => ScaleResponse | Promise<ScaleResponse>,
        options?: { ttl?: number }): Promise<JsonObject>;
  usage(): Promise<Usage>;
  rotateKey(): Promise<KeyRotation>;
  createKey(name: string, options?: { expiresIn?: number; scopes?: Scope[] }):
    Promise<CreatedApiKey>;
  listKeys(): Promise<ApiKey[]>;
  revokeKey(keyId: string): Promise<RevokedApiKey>;
  addSigningKey(publicKey: string, options?: { name?: string; expiresIn?: number }):
    Promise<SigningKey>;
  listSigningKeys(): Promise<SigningKey[]>;
  revokeSigningKey(keyId: string): Promise<RevokedSigningKey>;
  setSignatureScheme(scheme: SignatureScheme, options?: { graceSeconds?: number }):
    Promise<SignatureSchemeState>;
  auditLog(options?: { limit?: number; before?: number }): Promise<AuditEntry[]>;
  dailyUsage(options?: { days?: number }): Promise<UsageDay[]>;
}

export interface ErrorDetails {
  status?: number | null;
  requestId?: string | null;
  body?: { [key: string]: unknown };
  cause?: unknown;
}

/** Every error of the client: the service's error text as `message`, the HTTP `status` (null
 *  when nothing was answered), the `requestId` to quote to the service's operators. */
export class IntentGateError extends Error {
  constructor(message: string, details?: ErrorDetails);
  readonly status: number | null;
  readonly requestId: string | null;
  readonly body: { [key: string]: unknown };
}
/** 401 or 403: the key is missing, wrong, rotated, deactivated, or lacks a scope. */
export class AuthenticationError extends IntentGateError {}
/** 400, 413, 415 or 422, or a request that cannot be sent: a retry will not help. */
export class ValidationError extends IntentGateError {}
/** 429 `rate limit exceeded`. */
export class RateLimitError extends IntentGateError {
  constructor(message: string, details?: ErrorDetails & { retryAfter?: number | null });
  /** Seconds to wait, from Retry-After. */
  readonly retryAfter: number | null;
}
/** 429 `monthly verification limit reached`. */
export class QuotaExceededError extends RateLimitError {}
/** A 5xx or a network failure that lasted through every retry. */
export class ServiceError extends IntentGateError {
  constructor(message: string, details?: ErrorDetails & { maybeSent?: boolean });
  /** False only when no connection could be opened: the service never saw the request. */
  readonly maybeSent: boolean;
}
/** Thrown by guard when the gate blocks the AI's answer. */
export class Blocked extends IntentGateError {
  constructor(reason: BlockReason, result?: VerificationResult | null,
              details?: { requestId?: string | null });
  readonly reason: BlockReason;
  readonly result: VerificationResult | null;
}

/** A webhook event as the service sends it, with its webhook-id as `id`. */
export interface WebhookEvent {
  /** The webhook-id: the same on every attempt of one event; deduplicate by it. */
  id: string;
  type: string;
  timestamp: string;
  data: JsonObject;
}
/** The request is not an event the service signed with this secret, or it came too late. */
export class WebhookVerificationError extends Error {
  constructor(message: string);
}
/** Verify an incoming webhook (Standard Webhooks) and return its event, or throw
 *  WebhookVerificationError. `body` is the raw request body exactly as received; `headers`
 *  Node's request.headers, a fetch Headers, or any object of header names. A TypeError for a
 *  secret that is not `whsec_...` or a body that is not raw. */
export function verifyWebhook(secret: string, body: string | Uint8Array,
                              headers: { get(name: string): string | null }
                                | Record<string, string | string[] | undefined>,
                              options?: { now?: number }): WebhookEvent;

declare const intentgate: {
  AuthenticationError: typeof AuthenticationError;
  Blocked: typeof Blocked;
  Client: typeof Client;
  INTEGER_RANGE_MESSAGE: typeof INTEGER_RANGE_MESSAGE;
  IntentGateError: typeof IntentGateError;
  QuotaExceededError: typeof QuotaExceededError;
  RateLimitError: typeof RateLimitError;
  ServiceError: typeof ServiceError;
  ValidationError: typeof ValidationError;
  canonicalize: typeof canonicalize;
  generateEd25519KeyPair: typeof generateEd25519KeyPair;
  signResponse: typeof signResponse;
  signResponseEd25519: typeof signResponseEd25519;
  signingMessage: typeof signingMessage;
  verifyWebhook: typeof verifyWebhook;
  WebhookVerificationError: typeof WebhookVerificationError;
};
export default intentgate;
