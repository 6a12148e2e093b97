"""FlashInfer's autotune file keys, read without evaluating them.

A key of FlashInfer's v1 autotune file (``AutoTuner.save_configs``,
``flashinfer/autotuner/autotuner.py``, FlashInfer 0.7.4) is ``str(ProfilingCacheKey.key_fields)``:
``(custom_op, runner_class_name, nearest_profile, extras)``; files of FlashInfer before
``extras`` existed have ``(custom_op, runner_class_name, nearest_profile)``::

    "('bf16_gemm', 'CudnnBf16GemmRunner', ((1, 4096), (4096, 14336), (0,), (0,), (-1, 14336), (-1,)),
      (torch.bfloat16, False, True, True))"

Pure Python (re): no evaluation of file contents, no FlashInfer import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: Keys longer than this are not parsed (shown as they are); FlashInfer's are ~200 characters.
MAX_KEY_CHARS = 16 * 1024
#: Deepest nesting of brackets a key may have; FlashInfer's have 3.
MAX_KEY_DEPTH = 32


class BadFileKey(ValueError):
    """A file key that is not the ``str()`` of FlashInfer's ``(op, runner, shapes[, extras])`` tuple."""


@dataclass(frozen=True, repr=False)
class Name:
    """A bare name in a key, kept as written: ``torch.bfloat16``, ``inf``, or an opaque
    ``<ActivationType.Swiglu: 3>``. Its ``repr`` is its text, so a parsed key's ``str()``
    is the key again."""

    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class FileKey:
    """One entry's key, read: ``op`` (FlashInfer's custom op), ``runner`` (runner class),
    ``shapes`` (``nearest_profile``: bucketed input shapes), ``extras`` (the runner's further
    key fields; ints, floats, strings, ``True``/``False``/``None``, tuples, lists and dicts as
    Python values, anything else as a :class:`Name`). ``has_extras``: the key had its fourth
    field (FlashInfer files before it have three)."""

    op: str
    runner: str
    shapes: tuple[tuple[int, ...], ...]
    extras: tuple[Any, ...] = ()
    has_extras: bool = True

    def text(self) -> str:
        """The key as FlashInfer writes it: ``str()`` of the tuple."""
        fields = (self.op, self.runner, self.shapes, self.extras) if self.has_extras else (self.op, self.runner, self.shapes)
        return str(fields)

    @property
    def bucket(self) -> str:
        """The shapes, readable: ``AxB`` per input, space-separated (``1024x4096 4096x14336 0``)."""
        return " ".join("x".join(str(d) for d in shape) if shape else "()" for shape in self.shapes)

    @property
    def extras_text(self) -> str:
        """The extras as FlashInfer wrote them, without the parentheses: ``torch.bfloat16, False``."""
        return ", ".join(repr(value) for value in self.extras)


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<punct>[()\[\]{},:])
    | (?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
    | (?P<opaque>[bB](?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")|<[^<>\n]*>)
    | (?P<number>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)(?![\w.]))
    | (?P<name>-?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
    )""",
    re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t", "a": "\a", "b": "\b",
                   "f": "\f", "v": "\v", "0": "\0"}
_CONSTANTS = {"True": True, "False": False, "None": None}
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def _unescape(match: re.Match) -> str:
    code = match[1]
    if code[0] in "xuU" and len(code) > 1:
        return chr(int(code[1:], 16))
    return _SIMPLE_ESCAPES.get(code, match[0])


def _tokens(text: str) -> list[tuple[str, str]]:
    """``(kind, text)`` of each token; BadFileKey at the first character no token starts with."""
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if not text[pos:].strip():
                break
            raise BadFileKey(f"unexpected {text[pos:pos + 20]!r} at character {pos}")
        tokens.append((match.lastgroup, match[match.lastgroup]))
        pos = match.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens of one Python literal (tuples, lists, dicts,
    strings, numbers, names): the grammar of a ``repr``, nothing evaluated."""

    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.at = 0

    def _next(self) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise BadFileKey("the key ends early")
        token = self.tokens[self.at]
        self.at += 1
        return token

    def _peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) and self.tokens[self.at][0] == "punct" else None

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_KEY_DEPTH:
            raise BadFileKey(f"nested deeper than {MAX_KEY_DEPTH} levels")
        kind, text = self._next()
        if kind == "string":
            return _ESCAPE.sub(_unescape, text[1:-1])
        if kind == "number":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "name":
            return _CONSTANTS[text] if text in _CONSTANTS else Name(text)
        if kind == "opaque":
            return Name(text)
        if text not in _CLOSE:
            raise BadFileKey(f"unexpected {text!r}")
        return self._container(text, depth + 1)

    def _container(self, opening: str, depth: int) -> Any:
        closing, items, pairs, trailing_comma = _CLOSE[opening], [], [], False
        while self._peek() != closing:
            item = self.value(depth)
            if opening == "{":
                if self._next() != ("punct", ":"):
                    raise BadFileKey("a set, or a dict entry without ':'")
                pairs.append((item, self.value(depth)))
            else:
                items.append(item)
            if self._peek() == closing:
                trailing_comma = False
                break
            if self._next() != ("punct", ","):
                raise BadFileKey(f"expected ',' or {closing!r}")
            trailing_comma = True
        self._next()
        if opening == "[":
            return items
        if opening == "{":
            try:
                return dict(pairs)
            except TypeError:
                raise BadFileKey("a dict with an unhashable key") from None
        if len(items) == 1 and not trailing_comma:
            return items[0]  # "(x)" is x, as in Python; a 1-tuple is written "(x,)"
        return tuple(items)

    def parse(self) -> Any:
        result = self.value()
        if self.at != len(self.tokens):
            raise BadFileKey(f"unexpected {self.tokens[self.at][1]!r} after the key")
        return result


def _is_shapes(value: Any) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(shape, tuple) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        for shape in value
    )


def parse_file_key(text: str) -> FileKey:
    """Read a FlashInfer autotune file key (``str((op, runner, nearest_profile, extras))``,
    ``ProfilingCacheKey.file_key``) without evaluating it.

    A small tokenizer and recursive-descent parser of Python literals: names such as
    ``torch.bfloat16`` and opaque reprs such as ``<ActivationType.Swiglu: 3>`` stay text
    (:class:`Name`), so ``parse_file_key(k).text() == k`` for every key ``str()`` wrote.

    Raises:
        BadFileKey: longer than :data:`MAX_KEY_CHARS`, not a Python literal of the kinds
            above, or not a tuple ``(str, str, tuple of int tuples[, tuple])``.
    """
    if len(text) > MAX_KEY_CHARS:
        raise BadFileKey(f"key of {len(text)} characters (at most {MAX_KEY_CHARS} are read)")
    fields = _Parser(text).parse()
    if not isinstance(fields, tuple) or len(fields) not in (3, 4):
        raise BadFileKey("not a tuple (op, runner, shapes[, extras])")
    op, runner, shapes = fields[:3]
    extras = fields[3] if len(fields) == 4 else ()
    if not isinstance(op, str) or not isinstance(runner, str) or not _is_shapes(shapes) or not isinstance(extras, tuple):
        raise BadFileKey("not a tuple (op: str, runner: str, shapes: tuple of int tuples[, extras: tuple])")
    return FileKey(op=op, runner=runner, shapes=shapes, extras=extras, has_extras=len(fields) == 4)
