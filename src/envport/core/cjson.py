"""`json.loads` on CPython's C scanner alone, for the no-op build's one or two small documents.

`import json` compiles seven regular expressions and loads the encoder:
about a millisecond, a fortieth of a no-op `envport build` that has to stay
well under BuildKit's cached build (commands/fast.py).  `_json.make_scanner`
is what json.JSONDecoder runs underneath; it reads its options off any
object, so this module hands it json's defaults.  Without `_json` (another
interpreter) it is json.loads itself.
"""

from __future__ import annotations

_WHITESPACE = " \t\n\r"


class _Defaults:  # what json.decoder.JSONDecoder() sets: the attributes c_make_scanner reads
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    memo: dict = {}


_scan = None


def loads(data: bytes | str):
    """The value of the JSON document DATA; ValueError when it is not one (as json.loads)."""
    global _scan
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    if _scan is None:
        try:
            from _json import make_scanner
        except ImportError:
            import json

            return json.loads(text)
        _scan = make_scanner(_Defaults)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        raise ValueError(f"no JSON value at character {start}") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value
