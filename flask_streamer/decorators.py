"""View decorators on batched routes (``decorators=[...]``), as Flask's
``View.decorators`` applies them, and the two ways a view decorator put on
the batch function by mistake is told.

A view decorator (flask-httpauth's ``login_required``, flask-limiter's
``limit``, flask-cors's ``cross_origin``) reads the request it wraps. Put on
a batch function, it runs in a batch, apart from every request: Flask's
``RuntimeError: Working outside of request context`` on every call. So a
batch function wrapped by one is refused where the route is declared, when
that can be told (:func:`view_decorator_of`), and otherwise the error it
raises reaches the client and the log as one that names ``decorators=``
(:func:`explained`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

__all__ = ["ViewDecorator", "apply", "check_batch_function", "checked", "explained", "view_decorator_of"]

#: A view decorator: a view in, the view to register out.
ViewDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]

#: How Flask's ``RuntimeError`` begins for code that reads ``request`` (or
#: ``session``) or ``current_app`` (or ``g``) outside a request, Flask 2.3
#: to 3.1 (``flask.globals``): the one place this module reads Flask's words.
OUTSIDE_CONTEXT = ("Working outside of request context", "Working outside of application context")

#: The names of Flask's context globals: a wrapper whose own code reads one
#: of them needs a request (or the app) to run.
_CONTEXT_GLOBALS = frozenset({"request", "session", "current_app", "g", "current_user"})

#: How deep a chain of ``__wrapped__`` is followed, as :func:`inspect.unwrap` guards against a cycle.
_MOST_WRAPPERS = 100


def checked(decorators: Any, where: str) -> Tuple[ViewDecorator, ...]:
    """``decorators`` as a tuple of callables, or ``TypeError`` saying what
    to write: a list of decorators, each one as it would go above a view
    (``auth.login_required``, ``limiter.limit("10/minute")``)."""
    if callable(decorators) or isinstance(decorators, (str, bytes)) or not isinstance(decorators, Sequence):
        raise TypeError(
            f"decorators of {where} must be a list of view decorators, e.g. decorators=[auth.login_required], "
            f"got {decorators!r}"
        )
    for decorator in decorators:
        if not callable(decorator):
            raise TypeError(
                f"decorators of {where} must each be a view decorator (a callable taking the view), "
                f"got {decorator!r}: write it as it would go above a view, e.g. limiter.limit('10/minute')"
            )
    return tuple(decorators)


def apply(view: Callable[..., Any], decorators: Sequence[ViewDecorator], where: str) -> Callable[..., Any]:
    """``view`` with ``decorators`` applied in the order Flask's
    ``View.as_view`` applies ``View.decorators``: each wraps what the ones
    before it made, so the first in the list is the innermost (the one
    written lowest above a function) and the last the outermost, whose
    answer (a 401, a 429) comes before any other's. As ``as_view`` does,
    the result keeps the view's name, module and docstring, so a decorator
    without ``functools.wraps`` changes nothing the app or an extension
    reads from the view (flask-limiter keys its limits by the view's
    qualified name)."""
    decorated = view
    for decorator in decorators:
        decorated = decorator(decorated)
        if not callable(decorated):
            raise TypeError(
                f"the decorator {decorator!r} of {where} returned {decorated!r}, not a view: "
                "give decorators= the decorator itself, as it would go above a view"
            )
    if decorated is not view:
        for name in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(decorated, name, getattr(view, name))
    return decorated


def check_batch_function(model: Any, where: str) -> None:
    """Refuse a batch function (the model of ``where``) wrapped by a view
    decorator that can be told (:func:`view_decorator_of`), with
    ``TypeError``: it would need a request in every batch, where there is none."""
    decorator = view_decorator_of(model)
    if decorator is not None:
        raise TypeError(
            f"the batch function of {where} is wrapped by a view decorator ({decorator}), which needs a request, "
            "but a batch function runs in a batch, apart from every request: take the decorator off the function "
            "and give it to the route, decorators=[...]"
        )


def view_decorator_of(function: Any) -> Optional[str]:
    """The name of a view decorator wrapping ``function``, if one can be
    told: among the wrappers on it (each one's ``__wrapped__`` down to the
    function), one whose code is Flask's or a Flask extension's (a module
    of ``flask`` or of a ``flask_*`` package, this one's aside) and reads
    one of Flask's context globals (``request``, ``current_app``, ...),
    as flask-httpauth's, flask-login's, flask-limiter's and flask-cors's
    decorators do. Any other wrapper passes (``torch.no_grad()``,
    ``functools.lru_cache``, flask-caching's ``memoize``, which reads no
    request): a view decorator of the app's own is told at run time
    instead (:func:`explained`)."""
    wrapper = function
    for _ in range(_MOST_WRAPPERS):
        wrapped = getattr(wrapper, "__wrapped__", None)
        if wrapped is None:
            return None
        code = getattr(wrapper, "__code__", None)
        module = str(getattr(wrapper, "__globals__", {}).get("__name__", ""))
        package = module.partition(".")[0]
        flasks = package == "flask" or (package.startswith("flask_") and package != "flask_streamer")
        if flasks and code is not None and _CONTEXT_GLOBALS.intersection(code.co_names):
            return f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        wrapper = wrapped
    return None


def explained(exc: BaseException, where: str) -> BaseException:
    """``exc`` itself, or, where it is Flask's error for code that needs a
    request run outside one (raised by the model of ``where``, as it is
    from a view decorator on a batch function), a ``RuntimeError`` that
    says so and names ``decorators=``, with ``exc`` as its cause. A
    request's own code (its parse hook, its view) runs inside it and never
    raises this: only the batch runs apart from the request."""
    if not isinstance(exc, RuntimeError) or not str(exc).startswith(OUTSIDE_CONTEXT):
        return exc
    told = RuntimeError(
        f"the model of {where} needs a request ({str(exc).partition('.')[0]}), but runs in a batch, apart from "
        "every request: a view decorator (login, rate limit, CORS) goes in the route's decorators=[...], not on "
        "the batch function"
    )
    told.__cause__ = exc
    return told
