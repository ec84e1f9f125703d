// The ES module face of index.js (one implementation for require() and import).
import signer from './index.js';

export const {
  INTEGER_RANGE_MESSAGE,
  canonicalize,
  generateEd25519KeyPair,
  signResponse,
  signResponseEd25519,
  signingMessage,
} = signer;
export default signer;
