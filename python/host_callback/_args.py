"""Checks of the public functions' arguments, made where a callback is
bound (when the function is called or traced), not when the callback runs.

Each error names the function and the parameter, says what was expected
and what came; a keyword that is not a parameter names itself and, when
one is close, the parameter it was probably meant to be.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import math
import numbers
import operator
import sys
from typing import Any, Callable, Iterable, Mapping, TypeVar

import numpy as np

from host_callback._types import CallbackFlavor

F = TypeVar("F", bound=Callable[..., Any])


def _got(value: Any) -> str:
  """What came, for a message: its repr and its type."""
  text = repr(value)
  if len(text) > 60:
    text = text[:57] + "..."
  return f"{text} ({type(value).__name__})"


def closest(name: str, valid: Iterable[str]) -> str | None:
  """The parameter name that ``name`` is probably a misspelling of."""
  close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.8)
  return close[0] if close else None


def unexpected_keyword(api: str, name: str, valid: Iterable[str]) -> str:
  """``api() got an unexpected keyword argument 'x'`` (Python's words),
  with the parameter it is close to."""
  text = f"{api}() got an unexpected keyword argument {name!r}"
  if (near := closest(name, valid)) is not None:
    text += f"; did you mean {near!r}?"
  return text


def keywords(api: str) -> Callable[[F], F]:
  """Decorates a public function that has no ``**kwargs``: an unknown
  keyword is a ``TypeError`` that names it and the closest parameter,
  raised before the function runs (Python's own message has no
  suggestion)."""

  def decorate(func: F) -> F:
    valid = frozenset(
        p.name for p in inspect.signature(func).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
      if not valid.issuperset(kwargs):
        unknown = sorted(set(kwargs) - valid)[0]
        raise TypeError(unexpected_keyword(api, unknown, valid))
      return func(*args, **kwargs)

    return checked  # type: ignore[return-value]

  return decorate


def near_misses(api: str, kwargs: Mapping[str, Any],
                parameters: Iterable[str], what: str) -> None:
  """For a function whose ``**kwargs`` are data (``id_print``'s labels): a
  ``TypeError`` for a keyword one slip away from one of its parameters,
  which would otherwise be taken as data (``what`` says as what) and the
  parameter silently left at its default."""
  parameters = list(parameters)
  for name in kwargs:
    if name not in parameters and (near := closest(name, parameters)):
      raise TypeError(
          f"{api}() got the keyword argument {name!r}, which is close to its "
          f"parameter {near!r}: did you mean {near!r}? ({api} takes other "
          f"keyword arguments as {what}; rename this one to use it so.)")


def check_bool(api: str, name: str, value: Any) -> bool:
  """``value`` as a bool: ``True``/``False`` (numpy's too) or 0/1."""
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, numbers.Integral) and value in (0, 1):
    return bool(value)
  raise TypeError(f"{api}: {name} must be True or False, got {_got(value)}")


def check_callable(api: str, name: str, value: Any) -> None:
  if not callable(value):
    raise TypeError(f"{api}: {name} must be callable, got {_got(value)}")


def check_tap_signature(api: str, tap_func: Any,
                        with_device: bool) -> None:
  """A ``TypeError`` when ``tap_func`` cannot be called as a tap function
  is, ``tap_func(arg, transforms)`` (and ``device=`` with
  ``tap_with_device``), saying so; nothing when its signature cannot be
  read (a builtin, a C function)."""
  try:
    signature = inspect.signature(tap_func)
  except (TypeError, ValueError):
    return
  call = "tap_func(arg, transforms" + (", device=device)" if with_device
                                       else ")")
  try:
    if with_device:
      signature.bind(None, None, device=None)
    else:
      signature.bind(None, None)
  except TypeError as e:
    name = getattr(tap_func, "__qualname__", None) or repr(tap_func)
    raise TypeError(
        f"{api}: the tap function is called as {call}, but {name}{signature} "
        f"cannot be ({e}); give it a second parameter for the transforms"
        + (" and a keyword parameter device" if with_device else "")
        + " (def f(arg, transforms" + (", *, device" if with_device else "")
        + "): ...)") from None


def check_threshold(api: str, value: Any) -> int | None:
  """``numpy.array2string``'s ``threshold``: ``None`` or any real number but
  NaN, as numpy takes it; returned as the int that gives the same summary
  (an array is summarised when it has more elements)."""
  if value is None:
    return None
  if not isinstance(value, numbers.Real):
    raise TypeError(f"{api}: threshold must be a number (numpy's "
                    "array2string threshold: arrays with more elements are "
                    f"summarised) or None, got {_got(value)}")
  if isinstance(value, numbers.Integral):
    return max(-1, min(int(value), sys.maxsize))
  value = float(value)
  if math.isnan(value):
    raise ValueError(f"{api}: threshold must not be NaN")
  if math.isinf(value):
    return sys.maxsize if value > 0 else -1
  return max(-1, min(math.floor(value), sys.maxsize))


def check_stream(api: str, value: Any) -> None:
  """``output_stream``: None, a ``logging.Logger`` or a writable object."""
  if value is None or isinstance(value, logging.Logger):
    return
  if not callable(getattr(value, "write", None)):
    raise TypeError(f"{api}: output_stream must be None (sys.stdout), an "
                    "object with a write(str) method or a logging.Logger, "
                    f"got {_got(value)}")


def check_index(api: str, name: str, value: Any) -> int:
  """A non-negative integer (an index)."""
  if isinstance(value, bool):
    raise TypeError(f"{api}: {name} must be an int, got {_got(value)}")
  try:
    index = operator.index(value)
  except TypeError:
    raise TypeError(f"{api}: {name} must be an int, got {_got(value)}"
                    ) from None
  if index < 0:
    raise ValueError(f"{api}: {name} must be >= 0, got {index}")
  return index


def check_str(api: str, name: str, value: Any, *,
              optional: bool = False) -> None:
  if value is None and optional:
    return
  if not isinstance(value, str):
    expected = "a str or None" if optional else "a str"
    raise TypeError(f"{api}: {name} must be {expected}, got {_got(value)}")


def check_flavor(api: str, value: Any) -> None:
  if not isinstance(value, CallbackFlavor):
    raise TypeError(f"{api}: callback_flavor must be a CallbackFlavor "
                    "(CallbackFlavor.IO_CALLBACK, PURE or DEBUG), got "
                    f"{_got(value)}")
