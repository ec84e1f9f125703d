"""Semantic tags for a user token: from the configured context store, or the built-in deriver.

Wire contract with a context store (documented in the README):
    POST {CONTEXT_STORE_URL}
    Authorization: Bearer <user_token>          (the token never goes into the URL)
    Content-Type: application/json
    {}
answered by 2xx `{"tags": ["<tag>", ...]}` (at most MAX_TAGS strings of at most MAX_TAG_LENGTH),
within CONTEXT_STORE_DEADLINE, at most 64 KiB long and nested no deeper than request bodies may be
(app.strict_json.MAX_DEPTH).
"""
import logging
import time

import requests
from flask import current_app

from app import metrics, strict_json
from app.context_store import deriver
from app.context_store.session import AnswerTooLarge, DeadlineExceeded
from app.errors import BadGateway, BadRequest
from app.extensions import context_store

log = logging.getLogger(__name__)

FAILURE_TEXT = "context store request failed"
MAX_TAGS = 100
MAX_TAG_LENGTH = 100


class ContextStoreFailure(Exception):
    """Why the context store could not give tags (a kind of failure, never request data)."""


class StoreSilent(ContextStoreFailure):
    """The store did not answer in time: the call held its worker (see breaker)."""


class StoreRefused(ContextStoreFailure):
    """A 4xx: the store works and refused this token, however long it took to say so."""


def tags_for(user_token):
    """Return the semantic tags for this user token, or raise 502."""
    url = current_app.config["CONTEXT_STORE_URL"]
    if url is None:
        return deriver.tags_from_token(user_token)
    breaker = current_app.extensions["context_store_breaker"]
    admitted = breaker.allow()
    if admitted is None:
        _failed("breaker open")
    silent, started = False, time.monotonic()
    try:
        return _fetch(url, user_token)
    except ContextStoreFailure as failure:
        # A failure that took as long as a connection may take held its worker as a timeout
        # does (a store answering 504 after 19 s): it opens the breaker too. A refusal of one
        # user's token says nothing of the store's health: one client's bad tokens must not
        # open every tenant's break.
        silent = isinstance(failure, StoreSilent) or (
            not isinstance(failure, StoreRefused)
            and time.monotonic() - started >= current_app.config["CONTEXT_STORE_CONNECT_TIMEOUT"])
        if silent:
            log.warning("context store breaker open",
                        extra={"failure": str(failure), "seconds": breaker.timed_out(admitted)})
        _failed(str(failure))
    finally:
        if not silent:  # whatever else ended the call, a trial included
            breaker.answered()


def _failed(failure):
    log.warning(FAILURE_TEXT, extra={"failure": failure})
    metrics.record_context_store_failure(failure)
    raise BadGateway(FAILURE_TEXT) from None


def _fetch(url, user_token):
    try:
        status, body = context_store.post(
            url, json={}, headers={"Authorization": f"Bearer {user_token}"}
        )
    except DeadlineExceeded:
        raise StoreSilent("deadline exceeded") from None
    except AnswerTooLarge:
        raise ContextStoreFailure("answer too large") from None
    except requests.ConnectTimeout:
        raise StoreSilent("connect timeout") from None
    except requests.ReadTimeout:
        raise StoreSilent("read timeout") from None
    except requests.ConnectionError:
        raise ContextStoreFailure("connection failed") from None
    except requests.RequestException as exc:
        raise ContextStoreFailure(f"request error ({type(exc).__name__})") from None
    if 400 <= status < 500:
        raise StoreRefused(f"status {status}")
    if not 200 <= status < 300:
        raise ContextStoreFailure(f"status {status}")
    return _checked_tags(_parsed(body))


def _parsed(body):
    """The answer under the rules of request bodies: UTF-8 JSON, finite numbers, valid Unicode,
    at most MAX_DEPTH levels."""
    try:
        return strict_json.loads(body)
    except BadRequest as refused:
        if refused.error == strict_json.TOO_DEEP:
            raise ContextStoreFailure("answer is nested too deeply") from None
        raise ContextStoreFailure("answer is not JSON") from None


def _checked_tags(answer):
    tags = answer.get("tags") if isinstance(answer, dict) else None
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        raise ContextStoreFailure("answer has no list of tags")
    if not all(isinstance(tag, str) and len(tag) <= MAX_TAG_LENGTH for tag in tags):
        raise ContextStoreFailure("answer has a tag that is not a short string")
    return tags
