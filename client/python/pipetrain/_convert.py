"""Python values <-> the flatc-generated classes, driven by _schema.

Field names are the schema's (snake_case); enum values are given and
returned by name (a number is accepted too, as flatc's JSON does).
"""
import importlib
import math
import re

from . import _schema

_modules = {}


def module(name):
    """The generated module of a table or enum (pipetrain.<Name>)."""
    m = _modules.get(name)
    if m is None:
        m = _modules[name] = importlib.import_module(__package__ + "." + name)
    return m


def _camel(field, upper):
    """flatc's name for a field: upper for accessors, lower for object fields."""
    parts = field.split("_")
    head = parts[0][:1].upper() + parts[0][1:] if upper else parts[0]
    return head + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def enum_value(enum, value, where):
    values = _schema.ENUMS[enum]
    if isinstance(value, str):
        if value not in values:
            raise ValueError(f"{where}: unknown {enum} '{value}' (one of "
                             f"{', '.join(values)})")
        return values[value]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {enum} expected (a name or a number)")
    return value


def enum_name(enum, value):
    for k, v in _schema.ENUMS[enum].items():
        if v == value:
            return k
    return value


def _scalar(kind, value, where):
    """One scalar field; a number in quotes is read as flatc reads it."""
    if kind in ("int", "float") and isinstance(value, str) and not isinstance(value, Bare):
        try:
            value = number(value)
        except ValueError:
            raise ValueError(f"{where}: number expected, got '{value}'") from None
    if kind == "bool" and isinstance(value, str) and not isinstance(value, Bare):
        value = {"true": True, "false": False}.get(value, value)
        if isinstance(value, str):
            try:
                value = number(value)
            except ValueError:
                raise ValueError(f"{where}: true or false expected, got '{value}'") from None
    if kind == "bool":
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255:
            return value != 0
        if not isinstance(value, bool):
            raise ValueError(f"{where}: true or false expected")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: integer expected")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: number expected")
        return float(value)
    if kind == "string":
        if not isinstance(value, str) or isinstance(value, Bare):
            raise ValueError(f"{where}: string expected")
        return value
    raise ValueError(f"{where}: unsupported field kind {kind}")


def to_object(table, d, where):
    """A dict in the schema's JSON form -> the generated object-API instance
    (<Table>T) of table. Errors name the path (job.model[3].kind)."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: object expected")
    fields = _schema.TABLES[table]
    obj = getattr(module(table), table + "T")()
    for key, value in d.items():
        at = f"{where}.{key}"
        if key not in fields:
            raise ValueError(f"{at}: {table} has no field '{key}'")
        kind, typ, _ = fields[key]
        if value is None:
            continue
        if kind == "enum":
            value = enum_value(typ, value, at)
        elif kind == "table":
            value = to_object(typ, value, at)
        elif kind.startswith("["):
            if not isinstance(value, list):
                raise ValueError(f"{at}: array expected")
            inner = kind[1:-1]
            if inner == "table":
                value = [to_object(typ, v, f"{at}[{i}]") for i, v in enumerate(value)]
            elif inner == "enum":
                value = [enum_value(typ, v, f"{at}[{i}]") for i, v in enumerate(value)]
            else:
                value = [_scalar(inner, v, f"{at}[{i}]") for i, v in enumerate(value)]
        elif kind == "union":
            raise ValueError(f"{at}: unions are not accepted here")
        else:
            value = _scalar(kind, value, at)
        setattr(obj, _camel(key, False), value)
    return obj


def _ubytes(obj, fid):
    """The bytes of the [ubyte] field with id fid of a generated table."""
    tab = obj._tab
    o = tab.Offset(4 + 2 * fid)
    if o == 0:
        return b""
    return bytes(tab.Bytes[tab.Vector(o):tab.Vector(o) + tab.VectorLen(o)])


def _value(kind, typ, v):
    if kind == "string":
        return v.decode("utf-8", "replace") if v is not None else None
    if kind == "enum":
        return enum_name(typ, v)
    if kind == "table":
        return to_dict(typ, v) if v is not None else None
    return v


def to_dict(table, obj):
    """A generated table accessor (pipetrain.<Table>.<Table>) -> dict of every
    field, enums by name, strings decoded, [ubyte] as bytes."""
    out = {}
    for key, (kind, typ, fid) in _schema.TABLES[table].items():
        get = getattr(obj, _camel(key, True))
        if kind == "[int]" and typ is None and fid is not None and key == "data":
            out[key] = _ubytes(obj, fid)
        elif kind.startswith("["):
            n = getattr(obj, _camel(key, True) + "Length")()
            out[key] = [_value(kind[1:-1], typ, get(i)) for i in range(n)]
        elif kind == "union":
            continue
        else:
            out[key] = _value(kind, typ, get())
    return out


def nan_to_none(d):
    """Metric fields the server leaves NaN (not evaluated) become None."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


class Bare(str):
    """A bare identifier in a job file (an enum name, never a string)."""


_SPACE = re.compile(r'(?:\s+|//[^\n]*|/\*.*?\*/)*', re.S)
_NUMBER = re.compile(r'[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)'
                     r'(?:[pP][+-]?[0-9]+)?|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)')
_WORD = re.compile(r'[+-]?[A-Za-z_][A-Za-z0-9_]*')
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n",
            "r": "\r", "t": "\t"}


def number(text):
    """A number as flatc spells it (decimal, hex, hex float, inf, nan, a
    leading +) -> int or float; ValueError if it is not one."""
    t = text.strip()
    low = t.lower().lstrip("+-")
    if low in ("inf", "infinity", "nan"):
        return float(t.lower().lstrip("+"))
    m = _NUMBER.fullmatch(t)
    if m is None:
        raise ValueError(f"'{text}' is not a number")
    body = t.lstrip("+-")
    neg = t.startswith("-")
    if body[:2] in ("0x", "0X"):
        if "." in body or "p" in body or "P" in body:
            v = float.fromhex(body)
            return -v if neg else v
        v = int(body, 16)
        return -v if neg else v
    if "." in body or "e" in body or "E" in body:
        return float(t)
    return int(t)


class _Reader:
    """JSON as flatc 2.0.8 reads a job file: // and /* */ comments, trailing
    commas, bare or single-quoted keys, bare enum names, single-quoted
    strings, hex and hex-float numbers, inf and nan. A key given twice is an
    error, as in flatc."""

    def __init__(self, text):
        self.s, self.i = text.lstrip("\ufeff"), 0

    def fail(self, what):
        line = self.s.count("\n", 0, self.i) + 1
        col = self.i - (self.s.rfind("\n", 0, self.i) + 1) + 1
        raise ValueError(f"line {line}, column {col}: {what}")

    def space(self):
        self.i = _SPACE.match(self.s, self.i).end()
        return self.s[self.i:self.i + 1]

    def string(self, q):
        out, i = [], self.i + 1
        while True:
            if i >= len(self.s):
                self.fail("unterminated string")
            c = self.s[i]
            if c == q:
                self.i = i + 1
                return "".join(out)
            if c == "\\":
                e = self.s[i + 1:i + 2]
                if e in _ESCAPES:
                    out.append(_ESCAPES[e])
                    i += 2
                elif e in ("x", "u"):
                    n = 2 if e == "x" else 4
                    h = self.s[i + 2:i + 2 + n]
                    if len(h) != n or any(ch not in "0123456789abcdefABCDEF" for ch in h):
                        self.i = i
                        self.fail(f"bad \\{e} escape")
                    cp = int(h, 16)
                    i += 2 + n
                    if 0xD800 <= cp < 0xDC00 and self.s[i:i + 2] == "\\u":
                        lo = int(self.s[i + 2:i + 6], 16)
                        if 0xDC00 <= lo < 0xE000:
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                            i += 6
                    if 0xD800 <= cp < 0xE000:
                        self.i = i
                        self.fail("a lone surrogate in a string")
                    out.append(chr(cp))
                else:
                    self.i = i
                    self.fail(f"unknown escape '\\{e}'")
            else:
                out.append(c)
                i += 1

    def value(self):
        c = self.space()
        if c == "{":
            return self.container("}")
        if c == "[":
            return self.container("]")
        if c in ("'", '"'):
            return self.string(c)
        m = _WORD.match(self.s, self.i)
        if m is not None and m.group(0).lstrip("+-").lower() not in ("inf", "infinity", "nan"):
            w = m.group(0)
            self.i = m.end()
            if w in ("true", "false", "null"):
                return {"true": True, "false": False, "null": None}[w]
            if w[0] in "+-":
                self.fail(f"'{w}' is not a value")
            return Bare(w)
        m = _WORD.match(self.s, self.i) or _NUMBER.match(self.s, self.i)
        if m is None or m.end() == self.i:
            self.fail(f"unexpected character '{c}'" if c else "unexpected end of input")
        self.i = m.end()
        return number(m.group(0))

    def key(self):
        c = self.space()
        if c in ("'", '"'):
            return self.string(c)
        m = _WORD.match(self.s, self.i)
        if m is None or m.group(0)[0] in "+-":
            self.fail("a field name expected")
        self.i = m.end()
        return m.group(0)

    def container(self, close):
        self.i += 1
        out = {} if close == "}" else []
        while True:
            if self.space() == close:
                self.i += 1
                return out
            at = self.i
            if close == "}":
                k = self.key()
                if self.space() != ":":
                    self.fail("':' expected after a field name")
                self.i += 1
                if k in out:
                    self.i = at
                    self.fail(f"field '{k}' given twice")
                out[k] = self.value()
            else:
                out.append(self.value())
            c = self.space()
            if c == ",":
                self.i += 1
            elif c != close:
                self.fail(f"',' or '{close}' expected")


def loads_job(text):
    """A job file's JSON text, as flatc reads it -> dict (bare enum names
    come as Bare strings)."""
    r = _Reader(text)
    if r.space() != "{":
        r.fail("a job file is one object")
    d = r.value()
    if r.space():
        r.fail("text after the job object")
    return d
