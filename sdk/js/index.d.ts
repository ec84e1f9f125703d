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

declare const signer: {
  INTEGER_RANGE_MESSAGE: typeof INTEGER_RANGE_MESSAGE;
  canonicalize: typeof canonicalize;
  generateEd25519KeyPair: typeof generateEd25519KeyPair;
  signResponse: typeof signResponse;
  signResponseEd25519: typeof signResponseEd25519;
  signingMessage: typeof signingMessage;
};
export default signer;
