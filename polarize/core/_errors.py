"""The one exception type users see for bad input, and the checks of plain settings.

The CLI turns a `PolarizeError` into a single line on stderr and a non-zero exit
status; the Python API raises it as an ordinary `ValueError`. This module imports no
JAX: the CLI validates every argument with it before JAX is loaded. The checks of
arrays, which also hold under `jax.jit`, are in `_refuse`.
"""

import numbers


class PolarizeError(ValueError):
    """Bad input: the message names the argument, the value and the valid choices."""


def check_choice(argument: str, value: str, choices) -> str:
    """Return `value` if it is one of `choices`, else raise a `PolarizeError` listing them."""
    choices = list(choices)
    if value not in choices:
        raise PolarizeError(f"`{argument}` must be one of {', '.join(choices)}; got {value!r}")
    return value


def is_number(value, *, integer: bool = False) -> bool:
    """True for an int or float (NumPy's included), never for a bool or a string; with
    `integer`, for integers only (8.0 is not one)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return False
    if integer:
        return isinstance(value, numbers.Integral)
    return isinstance(value, numbers.Real)


def check_type(argument: str, value, kind: str):
    """Return `value` if it is of `kind` ("integer", "number" or "string"), else raise."""
    ok = isinstance(value, str) if kind == "string" else is_number(value, integer=kind == "integer")
    if not ok:
        article = "an" if kind == "integer" else "a"
        raise PolarizeError(f"`{argument}` must be {article} {kind}; got {value!r} ({type(value).__name__})")
    return value


def check_positive(argument: str, value, *, integer: bool = False):
    """Return `value` if it is a finite number > 0 (an int if `integer`), else raise."""
    if not is_number(value):
        kind = "a positive integer" if integer else "a positive finite number"
        raise PolarizeError(f"`{argument}` must be {kind}; got {value!r}")
    bad = value != value or value <= 0 or value == float("inf")
    if integer and not bad and int(value) != value:
        bad = True
    if bad:
        kind = "a positive integer" if integer else "a positive finite number"
        raise PolarizeError(f"`{argument}` must be {kind}; got {value!r}")
    return int(value) if integer else value
