'use strict';
// RFC 8785 (JSON Canonicalization Scheme). The RFC defines its number and string forms as
// ECMAScript's own (Number.prototype.toString, JSON.stringify of a string), so this is
// JSON.stringify per value plus object members sorted by UTF-16 code units, which is what
// Array.prototype.sort does to strings. Values are read as JSON.stringify reads them (toJSON,
// boxed primitives, undefined members dropped), so the canonical form is that of the JSON text
// JSON.stringify sends: what the gate parses and canonicalizes again.

const NON_FINITE = 'payload numbers must be finite (no NaN or infinity)';
const LONE_SURROGATE_TEXT = 'payload strings must be valid Unicode (no lone surrogates)';
const INTEGER_RANGE_MESSAGE =
  'payload integers must be within ±(2^53-1); send larger values as strings';
// In a `u` regular expression a surrogate pair is one code point, so only lone ones match.
const LONE_SURROGATE = /\p{Surrogate}/u;

function canonicalize(value) {
  return serialize(value, { refuseUnsafeIntegers: false });
}

// The signers' form: also refuses what the gate would refuse in the JSON text JSON.stringify
// makes. An integer-valued number beyond ±(2^53-1) and below 1e21 is written as an integer
// token, and the gate refuses such integers (CONTRACT.md); from 1e21 on it is written with an
// exponent and read back as the same double, which signs exactly.
function canonicalizeForSigning(value) {
  return serialize(value, { refuseUnsafeIntegers: true });
}

function serialize(value, options) {
  const text = write(value, '', options, new Set());
  if (text === undefined) {
    throw new TypeError(`cannot canonicalize ${describe(value)}: it has no JSON form`);
  }
  return text;
}

function write(value, key, options, ancestors) {
  if (value !== null && typeof value === 'object' && typeof value.toJSON === 'function') {
    value = value.toJSON(key);
  }
  if (value instanceof Number || value instanceof String || value instanceof Boolean) {
    value = value.valueOf();
  }
  switch (typeof value) {
    case 'string':
      return writeString(value);
    case 'number':
      return writeNumber(value, options);
    case 'boolean':
      return value ? 'true' : 'false';
    case 'bigint':
      throw new TypeError('BigInt values have no JSON form: send them as strings, or as ' +
        'numbers within ±(2^53-1)');
    case 'undefined':
    case 'function':
    case 'symbol':
      return undefined; // dropped from an object, null in an array, as JSON.stringify does
    default:
      break;
  }
  if (value === null) return 'null';
  if (ancestors.has(value)) throw new TypeError('cannot canonicalize a circular structure');
  ancestors.add(value);
  const text = Array.isArray(value)
    ? writeArray(value, options, ancestors)
    : writeObject(value, options, ancestors);
  ancestors.delete(value);
  return text;
}

function writeArray(array, options, ancestors) {
  const items = [];
  for (let index = 0; index < array.length; index += 1) {
    const item = write(array[index], String(index), options, ancestors);
    items.push(item === undefined ? 'null' : item);
  }
  return `[${items.join(',')}]`;
}

function writeObject(object, options, ancestors) {
  const members = [];
  for (const key of Object.keys(object).sort()) {
    const item = write(object[key], key, options, ancestors);
    if (item !== undefined) members.push(`${writeString(key)}:${item}`);
  }
  return `{${members.join(',')}}`;
}

function writeString(string) {
  if (LONE_SURROGATE.test(string)) throw new TypeError(LONE_SURROGATE_TEXT);
  return JSON.stringify(string);
}

function writeNumber(number, options) {
  if (!Number.isFinite(number)) throw new RangeError(NON_FINITE);
  if (options.refuseUnsafeIntegers && Number.isInteger(number) &&
      Math.abs(number) > Number.MAX_SAFE_INTEGER && Math.abs(number) < 1e21) {
    throw new RangeError(INTEGER_RANGE_MESSAGE);
  }
  return JSON.stringify(number); // -0 is "0", as RFC 8785 wants
}

function describe(value) {
  return value === undefined ? 'undefined' : `a ${typeof value}`;
}

module.exports = {
  INTEGER_RANGE_MESSAGE,
  LONE_SURROGATE,
  canonicalize,
  canonicalizeForSigning,
};
