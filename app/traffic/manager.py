"""Flask-Limiter's LimitManager, answering each endpoint's question once.

Which limits apply to an endpoint and what exempts it are settled once the blueprints are
registered, yet the library works both out again on every request: its resolution (blueprint
ancestry, exemption scopes, a Limit built from each limit string, parsed again) was a third of
its cost per request under the profiler. This manager keeps each answer, keyed by the endpoint
and by the current value of the limit strings that apply (they follow the settings, so a
changed RATE_LIMIT_CAPACITY is seen on the next request), and forgets everything when a limit
or an exemption is added. The limits themselves are unchanged: keys, exemptions (`exempt_when`)
and scopes are still evaluated by the library on every request. With default limits nothing is
kept: whether they apply follows each request's method.
"""
import weakref

from flask import current_app
from flask.globals import _cv_app
from flask_limiter.manager import LimitManager
from flask_limiter.util import get_qualified_name


class ResolvedLimitManager(LimitManager):
    def __init__(self, manager):
        super().__init__(
            application_limits=manager._application_limits,
            default_limits=manager._default_limits,
            decorated_limits=manager._decorated_limits,
            blueprint_limits=manager._blueprint_limits,
            route_exemptions=manager._route_exemptions,
            blueprint_exemptions=manager._blueprint_exemptions,
        )
        # Per app (the library passes current_app, a proxy: the app behind it is the key), so
        # that apps with other blueprints or exemptions, as in the tests, keep their own.
        self._answers = weakref.WeakKeyDictionary()
        self._groups = {}  # blueprint -> the limit providers that apply to it

    def resolve_limits(self, app, endpoint=None, blueprint=None, callable_name=None,
                       in_middleware=False, marked_for_limiting=False):
        if self._follows_method():
            return super().resolve_limits(app, endpoint, blueprint, callable_name,
                                          in_middleware, marked_for_limiting)
        answers = self._answers_of(app)
        key = ("limits", endpoint, blueprint, callable_name, in_middleware, marked_for_limiting)
        values = self._limit_values(blueprint)
        known = answers.get(key)
        if known is None or known[0] != values:
            known = answers[key] = (values, super().resolve_limits(
                app, endpoint, blueprint, callable_name, in_middleware, marked_for_limiting))
        return known[1]

    def view_limits(self, app, endpoint, blueprint):
        """The limits a view's check() applies, in the order the library evaluates them, when
        they are all declared on its blueprints or on itself and spend a fixed cost whatever
        the response; None otherwise (app.traffic.limiter leaves those to the library)."""
        if self._follows_method():
            return None
        answers = self._answers_of(app)
        key = ("view", endpoint, blueprint)
        values = self._limit_values(blueprint)
        known = answers.get(key)
        if known is None or known[0] != values:
            view = app.view_functions.get(endpoint)
            name = get_qualified_name(view) if view else ""
            _, decorated = super().resolve_limits(app, endpoint, blueprint, name)
            plain = all(limit.deduct_when is None and isinstance(limit._cost, int)
                        for limit in decorated)
            known = answers[key] = (values, sorted(decorated, key=_by_item) if plain else None)
        return known[1]

    def exemption_scope(self, app, endpoint, blueprint):
        answers = self._answers_of(app)
        key = ("exemption", endpoint, blueprint)
        scope = answers.get(key)
        if scope is None:
            scope = answers[key] = super().exemption_scope(app, endpoint, blueprint)
        return scope

    def _follows_method(self):
        """With default limits, whether they apply follows the request's method (a view's own
        limits for other methods only leave it under them): nothing is kept per endpoint then,
        the library resolves each request."""
        return bool(self._default_limits)

    def _answers_of(self, app):
        if app is current_app:  # the proxy itself (no lookup through it): the app behind it
            app = _cv_app.get().app
        answers = self._answers.get(app)
        if answers is None:
            answers = self._answers[app] = {}
        return answers

    def _limit_values(self, blueprint):
        """The limit strings now in force for `blueprint` (and its parents), the defaults and
        any limit decorating a view (none here: limits are declared per blueprint)."""
        groups = self._groups.get(blueprint)
        if groups is None:
            groups = [*self._application_limits, *self._default_limits]
            for member in (blueprint or "").split("."):
                groups.extend(self._blueprint_limits.get(member, ()))
            for decorated in self._decorated_limits.values():
                groups.extend(decorated)
            groups = self._groups[blueprint] = [group.limit_provider for group in groups]
        return tuple([provider() if callable(provider) else provider for provider in groups])

    def _forget(self):
        self._answers.clear()
        self._groups.clear()

    def set_application_limits(self, limits):
        super().set_application_limits(limits)
        self._forget()

    def set_default_limits(self, limits):
        super().set_default_limits(limits)
        self._forget()

    def add_decorated_limit(self, route, limit, override=False):
        super().add_decorated_limit(route, limit, override)
        self._forget()

    def add_blueprint_limit(self, blueprint, limit):
        super().add_blueprint_limit(blueprint, limit)
        self._forget()

    def add_route_exemption(self, route, scope):
        super().add_route_exemption(route, scope)
        self._forget()

    def add_blueprint_exemption(self, blueprint, scope):
        super().add_blueprint_exemption(blueprint, scope)
        self._forget()

    def add_endpoint_hint(self, endpoint, callable):  # noqa: A002 - the library's name
        super().add_endpoint_hint(endpoint, callable)
        self._forget()


def _by_item(limit):
    return limit.limit
