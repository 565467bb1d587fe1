"""The user's own code named on the command line as ``MODULE:NAME`` (a model factory, a trainer, a statistic)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from dpaudit.errors import UsageError


def load_callable(option: str, spec: str, arguments: tuple[str, ...], returns: str) -> Callable:
    """The callable ``NAME`` of the importable module ``MODULE`` that ``spec`` (``MODULE:NAME``) names.

    Args:
        option: the option that named it (``--model``), for the error message.
        spec: ``MODULE:NAME``.
        arguments: the names of the arguments it is called with, e.g. ``("input_shape", "num_classes")``; a
            callable whose signature cannot take that many positional arguments is refused.
        returns: what it must return, in words, for the error message.

    Returns:
        The callable.

    Raises:
        UsageError: ``spec`` is not ``MODULE:NAME``, the module cannot be imported, or ``NAME`` is not a callable
            taking ``arguments``.
    """
    module_name, _, name = spec.partition(":")
    if not (module_name and name):
        raise UsageError(f"{option} must be MODULE:NAME (an importable module and a callable in it), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(
            f"{option} {spec}: cannot import module {module_name!r} ({error}); put its directory on PYTHONPATH"
        ) from None
    found = getattr(module, name, None)
    called = f"{name}({', '.join(arguments)})"
    if not callable(found):
        what = "has no attribute" if found is None else f"has a {type(found).__name__}, not a callable,"
        raise UsageError(
            f"{option} {spec}: module {module_name!r} {what} {name!r}; name a function or class called as {called}"
            f" that returns {returns}"
        )
    try:
        inspect.signature(found).bind(*arguments)
    except TypeError as error:
        raise UsageError(
            f"{option} {spec}: {name} cannot be called as {called} ({error}); give it those parameters"
        ) from None
    except ValueError:  # no signature to read (some builtins): the call itself tells
        pass
    return found
