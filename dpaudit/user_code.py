"""The user's own code named on the command line as ``MODULE:NAME`` (a model factory, a trainer, a statistic)."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from dpaudit.errors import UsageError

_DPAUDIT = Path(__file__).parent  # dpaudit's package directory


@contextmanager
def blamed_on_user(what: str, stage: str, user_files: Collection[str] | None = None) -> Iterator[None]:
    """An exception the user's code raises inside the block becomes a :class:`UsageError` naming it.

    The one line names ``what`` (``--model mymodels:make``), the ``stage`` (import, build, forward on a batch of
    shape …) and the exception's own message; ``DPAUDIT_DEBUG=1`` shows its traceback (the error's cause).
    ``SystemExit`` (``sys.exit`` in the user's code) is reported the same way rather than ending dpaudit with its
    code; Ctrl-C is not the user's code failing and stays an interruption.

    Args:
        what: the user's code, as the option that named it.
        stage: what dpaudit was doing with it.
        user_files: None: the block runs nothing but the user's code, so every exception is theirs. Otherwise the
            source files of the user's code, where the block also runs dpaudit's own code (the training step
            around a model's forward pass): the exception is the user's when, of the frames it passed through, the
            innermost one in either the user's files or dpaudit's is the user's (torch's frames between tell
            nothing). A dpaudit bug stays one.
    """
    try:
        yield
    except UsageError:
        raise
    except (Exception, SystemExit) as error:
        if user_files is not None and not _raised_in(error, user_files):
            raise
        message = f"sys.exit({error.code!r})" if isinstance(error, SystemExit) else " ".join(str(error).split())
        raise UsageError(
            f"{what}: {stage} failed, in your code: {type(error).__name__}: {message or '(no message)'};"
            " fix it there (DPAUDIT_DEBUG=1 shows the traceback)"
        ) from error


def _raised_in(error: BaseException, user_files: Collection[str]) -> bool:
    """Whether the innermost frame of ``error``'s traceback that is the user's or dpaudit's is the user's."""
    files = []
    trace = error.__traceback__
    while trace is not None:
        files.append(trace.tb_frame.f_code.co_filename)
        trace = trace.tb_next
    for file in reversed(files):
        if file in user_files:
            return True
        if Path(file).is_relative_to(_DPAUDIT):
            return False
    return False


def source_files(objects: Collection[object]) -> frozenset[str]:
    """The source files defining the classes of ``objects`` (a model's modules), dpaudit's and torch's left out."""
    files = set()
    for thing in objects:
        module = sys.modules.get(type(thing).__module__)
        file = getattr(module, "__file__", None)
        if file is not None and not type(thing).__module__.startswith(("torch.", "dpaudit.")):
            files.add(file)
    return frozenset(files)


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
    with blamed_on_user(f"{option} {spec}", f"importing module {module_name!r}"):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is None or not f"{module_name}.".startswith(f"{error.name}."):
                raise  # a module that the user's module imports is missing: the user's import failed
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
