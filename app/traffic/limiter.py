"""Flask-Limiter's Limiter, with its per-request state found in one step.

The library keeps what a request learnt of its limits (the limit for the headers, the limits
already checked) on the request context, in a dict of one LimiterContext per Limiter, and looks
it up there through Flask's proxy twice per access, eight accesses a request: under the
profiler the lookup cost as much as the library's whole decision. This Limiter keeps its
LimiterContext in an attribute of the request context of its own, found with one read of the
context variable behind Flask's proxy (Flask's own `_cv_request`, no proxy in between) and one
attribute read; the state, its lifetime and everything the library does with it are
unchanged. Its LimitManager answers each endpoint's question once (app.traffic.manager).

check() makes the library's decision for the limits this service declares (on blueprints, by
app.traffic.limits) with what does not change between requests settled once per endpoint: the
library works out again on every request which limits apply (the view's name, exemptions,
the limits already seen, the meta limits and their exemption scope, the limits' order), about
95 K of a verify's 2.0 M instructions (bench/instructions.py) and 50 us of its CPU. Each
request still has each limit's exemption, key and scope asked, spends from it and records it
for the headers as the library does; a breach goes through the same callbacks to the same
RateLimitExceeded. What the library can be asked to do beyond that goes its own way.
"""
import flask_limiter
from flask.globals import _cv_app, _cv_request
from flask.wrappers import Response
from flask_limiter.errors import RateLimitExceeded
from flask_limiter.extension import LimiterContext
from flask_limiter.wrappers import RequestLimit

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

    def _check_request_limit(self, callable_name=None, in_middleware=True):
        """check()'s decision (auto_check is off: check() is the only caller with these
        arguments), made as the library makes it for the limits declared on a view and its
        blueprints, found once per endpoint (app.traffic.manager). Whatever else the library
        can be asked to do (meta, default and application limits, the in-memory fallback,
        swallowed errors, request filters, conditional deductions, a cost read per request)
        goes its own way."""
        limits = None
        if callable_name is None and not in_middleware and self._declared_only():
            asked = _cv_request.get().request
            endpoint = self.identify_request()
            if endpoint and endpoint.rpartition(".")[2] != "static":
                limits = self.limit_manager.view_limits(_cv_app.get().app, endpoint,
                                                        asked.blueprint)
        if limits is None:
            return super()._check_request_limit(callable_name, in_middleware)
        return self._evaluate(endpoint, asked.method, limits)

    def _declared_only(self):
        return (self.enabled and self.initialized and not self._meta_limits
                and not self._request_filters and not self._in_memory_fallback_enabled
                and not self._swallow_errors)

    def _evaluate(self, endpoint, method, limits):
        """The library's evaluation of `limits` (in its order) where no meta limit is set: each
        limit not exempt is spent from, the limit for the headers chosen as it chooses it, and
        a breach answered through the on_breach callbacks and RateLimitExceeded."""
        failed, view_limits, for_header = [], [], None
        for lim in limits:
            if lim.is_exempt or lim.method_exempt:
                continue
            scope = lim.scope_for(endpoint, method)
            args = [lim.key_func(), scope]
            if not all(args):
                self.logger.error(f"Skipping limit: {lim.limit}. Empty value found in parameters.")
                continue
            if self._key_prefix:
                args = [self._key_prefix, *args]
            request_limit = RequestLimit(self, lim.limit, args, False, lim.shared)
            view_limits.append(request_limit)
            if not self.limiter.hit(lim.limit, *args, cost=lim.cost):
                self.logger.info("ratelimit %s (%s) exceeded at endpoint: %s", lim.limit,
                                 args[-2], scope)
                request_limit.breached = True
                for_header = request_limit
                failed.append((lim, args))
                if self._fail_on_first_breach:
                    break
        if for_header is None and view_limits:
            # As the library: a limit of the view's own over a shared one, for the headers.
            explicit = [limit for limit in view_limits if not limit.shared]
            for_header = explicit[0] if explicit else view_limits[0]
        context = self.context
        context.view_rate_limit = for_header
        context.view_rate_limits = view_limits
        if failed:
            self._breached(failed)

    def _breached(self, failed):
        response = None
        for lim, args in failed:
            request_limit = RequestLimit(self, lim.limit, args, True, lim.shared)
            for callback in dict.fromkeys([self._on_breach, lim.on_breach]):
                if callback:
                    answer = callback(request_limit)
                    if isinstance(answer, Response):
                        response = answer
        raise RateLimitExceeded(sorted(failed, key=lambda item: item[0].limit)[0][0],
                                response=response)
