"""The one exception type users see for bad input, and the checks of plain settings.

The CLI turns a `PolarizeError` into a single line on stderr and a non-zero exit
status; the Python API raises it as an ordinary `ValueError`. This module imports no
JAX: the CLI validates every argument with it before JAX is loaded. The checks of
arrays, which also hold under `jax.jit`, are in `_refuse`.
"""


class PolarizeError(ValueError):
    """Bad input: the message names the argument, the value and the valid choices."""


def check_choice(argument: str, value: str, choices) -> str:
    """Return `value` if it is one of `choices`, else raise a `PolarizeError` listing them."""
    choices = list(choices)
    if value not in choices:
        raise PolarizeError(f"`{argument}` must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_positive(argument: str, value, *, integer: bool = False):
    """Return `value` if it is a finite number > 0 (an int if `integer`), else raise."""
    bad = value is None or value != value or value <= 0 or value == float("inf")
    if integer and not bad and int(value) != value:
        bad = True
    if bad:
        kind = "a positive integer" if integer else "a positive finite number"
        raise PolarizeError(f"`{argument}` must be {kind}; got {value!r}")
    return int(value) if integer else value
