"""Flask-Limiter's Limiter, with its per-request state found in one step.

The library keeps what a request learnt of its limits (the limit for the headers, the limits
already checked) on the request context, in a dict of one LimiterContext per Limiter, and looks
it up there through Flask's proxy twice per access, eight accesses a request: under the
profiler the lookup cost as much as the library's whole decision. This Limiter keeps its
LimiterContext in an attribute of the request context of its own, found with one read of the
context variable behind Flask's proxy (Flask's own `_cv_request`, no proxy in between) and one
attribute read; the state, its lifetime and everything the library does with it are
unchanged. Its LimitManager answers each endpoint's question once (app.traffic.manager).
"""
import flask_limiter
from flask.globals import _cv_request
from flask_limiter.extension import LimiterContext

from app.traffic.manager import ResolvedLimitManager


class Limiter(flask_limiter.Limiter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.limit_manager = ResolvedLimitManager(self.limit_manager)
        # One attribute per Limiter: two limiters on one app keep their own state.
        self._state = f"_intentgate_limiter_{id(self)}"

    def init_app(self, app):
        # Flask-Limiter merges each app's RATELIMIT_STORAGE_OPTIONS into those of the apps
        # before it, and one Limiter serves every app a process makes (the tests make many): a
        # Redis Cluster's options then reached a single Redis's connections. Each app's own.
        self._storage_options = {}
        super().init_app(app)

    @property
    def context(self):
        state = _cv_request.get()  # LookupError outside a request, as the proxy's RuntimeError
        try:
            return getattr(state, self._state)
        except AttributeError:
            context = LimiterContext()
            setattr(state, self._state, context)
            return context
