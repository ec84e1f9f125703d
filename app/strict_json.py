"""Strict JSON for request bodies (CONTRACT.md, Wire format): anything but UTF-8 JSON text of
at most 64 levels, with finite numbers, valid Unicode strings and distinct keys in each object,
is a 400 with a clear text.

The standard library's C parser does the work. The checks it cannot make stay cheap on the hot
path: only a body with more than 64 opening brackets can be too deep, so only such a body is
walked; lone surrogates can only come from \\uD800-\\uDFFF escapes, found in the text itself.
"""
import json
import re

from app.errors import BadRequest

MAX_DEPTH = 64

NOT_AN_OBJECT = "request body must be a JSON object"
NOT_JSON = "request body is not valid JSON"
NOT_UTF8 = "request body must be UTF-8 encoded JSON"
TOO_DEEP = "request body is nested too deeply"
LONE_SURROGATE = "request body strings must be valid Unicode: lone surrogates are not allowed"
NOT_A_NUMBER = "request body is not valid JSON: NaN and Infinity are not JSON numbers"
DUPLICATE_KEY = "request body repeats a key within one object"

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# In valid JSON text every backslash starts an escape, so a left-to-right scan that removes
# escaped backslashes and well-formed surrogate pairs leaves a surrogate escape only where one
# stands alone.
_BACKSLASH_OR_PAIR = re.compile(r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _refuse_constant(name):
    raise BadRequest(NOT_A_NUMBER)


def _object(pairs):
    """A JSON object whose keys are distinct (I-JSON, RFC 7493, on which RFC 8785 rests): with a
    repeated key, parsers disagree on the value (first or last), and what the gate verified
    could differ from what a client's parser shows."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise BadRequest(DUPLICATE_KEY)
    return value


def _int_or_stand_in(literal):
    try:
        return int(literal)
    except ValueError:  # past Python's digit limit (4300 by default)
        # Far outside the range every field and the payload allow, as the literal is: the
        # schema then refuses it with the field's own text.
        return -(2**64) if literal.startswith("-") else 2**64


# Python's json accepts NaN and Infinity, which JSON does not. (No parse_int hook on the hot
# path: one Python call per integer would double the cost of parsing a typical verify body;
# one per object costs about a microsecond a body.)
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, object_pairs_hook=_object)
_DECODER_OF_LONG_INTEGERS = json.JSONDecoder(parse_constant=_refuse_constant,
                                             object_pairs_hook=_object, parse_int=_int_or_stand_in)


def loads(raw):
    """Parse a request body (bytes) or raise BadRequest with the contract's text."""
    try:
        text = raw.decode("utf-8")  # refuses encoded surrogates too
    except UnicodeDecodeError:
        raise BadRequest(NOT_UTF8) from None
    if text.startswith("\ufeff"):
        text = text[1:]  # RFC 8259 section 8.1 lets a parser ignore a byte order mark
    try:
        value = _decode(text)
    except RecursionError:  # far deeper than MAX_DEPTH: the parser gave up before we could look
        raise BadRequest(TOO_DEEP) from None
    except json.JSONDecodeError:
        raise BadRequest(NOT_JSON) from None
    if _SURROGATE_ESCAPE.search(text) and _SURROGATE_ESCAPE.search(
            _BACKSLASH_OR_PAIR.sub("", text)):
        raise BadRequest(LONE_SURROGATE)
    if text.count("[") + text.count("{") > MAX_DEPTH and deeper_than(value, MAX_DEPTH):
        raise BadRequest(TOO_DEEP)
    return value


def _decode(text):
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError:
        raise
    except ValueError:  # int() refused a literal past Python's digit limit
        return _DECODER_OF_LONG_INTEGERS.decode(text)


def deeper_than(value, limit):
    """True when a container sits more than `limit` levels down (the top level is 1).
    Iterative, as the value may be deep; exact type checks, as json makes only dict and list."""
    pending = [(value, 1)] if type(value) in (dict, list) else []
    while pending:
        container, depth = pending.pop()
        if depth > limit:
            return True
        for child in container.values() if type(container) is dict else container:
            kind = type(child)
            if kind is dict or kind is list:
                pending.append((child, depth + 1))
    return False
