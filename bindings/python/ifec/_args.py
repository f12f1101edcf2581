"""Checks of the Python API's arguments: each names the argument and the value it refuses (the native layer would
raise a bare TypeError, or take a string for a list of its characters and 'off' for True)."""

import math
import numbers
import os


def flag(value, name):
    """A bool (or 0/1); 'off', None or 2 are refused, not taken for their truth."""
    if isinstance(value, bool) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name}={value!r}: expected True or False")


def _number(value):
    """A real number, finite (an integer of any size is; a bool or a string is not a number here)."""
    return (not isinstance(value, bool) and isinstance(value, numbers.Real)
            and (isinstance(value, numbers.Integral) or math.isfinite(value)))


def whole(value, name, lo=0, hi=2**63 - 1):
    """A whole number in lo..hi (an integral float such as 4096.0 too; 2.7 is refused, not truncated)."""
    if not _number(value) or (not isinstance(value, numbers.Integral) and value != int(value)):
        raise TypeError(f"{name}={value!r}: expected a whole number")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}={value!r} outside {lo}..{hi}")
    return int(value)


def items(value, name):
    """A list of strings; one string is one item (not a list of its characters)."""
    if isinstance(value, str):
        return [value]
    try:
        out = list(value)
    except TypeError:
        raise TypeError(f"{name}={value!r}: expected a string or a list of strings") from None
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"{name}: {v!r} is not a string")
    return out


def topology(value, load):
    """A path (str or os.PathLike) is loaded with `load`; anything else is taken as an ifec.Topology."""
    return load(os.fspath(value)) if isinstance(value, (str, os.PathLike)) else value


def turns(value):
    """The carried state an operation starts from: a dict (or None), its None values left out."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"turns={value!r}: expected a dict of group, stripe and multicast")
    return {k: v for k, v in value.items() if v is not None}


def real(value, name, lo, hi):
    """A finite real number in lo..hi (not a bool or a string)."""
    if not _number(value):
        raise TypeError(f"{name}={value!r}: expected a number")
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} outside {lo}..{hi}")
    return float(value)
