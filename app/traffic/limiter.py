"""Flask-Limiter's Limiter, with its per-request state found in one step.

The library keeps what a request learnt of its limits (the limit for the headers, the limits
already checked) on the request context, and looks it up there through Flask's proxy twice per
access, eight accesses a request: under the profiler the lookup cost as much as the library's
whole decision. This Limiter resolves the proxy once per access; the state, its lifetime and
everything the library does with it are unchanged. Its LimitManager answers each endpoint's
question once (app.traffic.manager).
"""
from collections import defaultdict

import flask_limiter
from flask.globals import request_ctx
from flask_limiter.extension import LimiterContext

from app.traffic.manager import ResolvedLimitManager

_STATE = "_limiter_request_context"  # the library's own attribute on the request context


class Limiter(flask_limiter.Limiter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit_manager = ResolvedLimitManager(self.limit_manager)

    @property
    def context(self):
        state = vars(request_ctx._get_current_object())
        contexts = state.get(_STATE)
        if contexts is None:
            contexts = state[_STATE] = defaultdict(LimiterContext)
        return contexts[self]
