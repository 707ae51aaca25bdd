"""Python values <-> the flatc-generated classes, driven by _schema.

Field names are the schema's (snake_case); enum values are given and
returned by name (a number is accepted too, as flatc's JSON does).
"""
import importlib
import json
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
    if kind == "bool":
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
        if not isinstance(value, str):
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


_TOKEN = re.compile(r'(?P<str>"(?:[^"\\]|\\.)*")|(?P<comment>//[^\n]*|/\*.*?\*/)|'
                    r'(?P<trail>,(?=(?:\s|//[^\n]*|/\*.*?\*/)*[}\]]))|'
                    r'(?P<num>-?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<other>.)', re.S)


def loads_job(text):
    """JSON as flatc reads it (// and /* */ comments, trailing commas, bare
    field names and enum values) -> dict."""
    out = []
    for m in _TOKEN.finditer(text):
        kind, t = m.lastgroup, m.group(0)
        if kind in ("comment", "trail"):
            continue
        if kind == "word" and t not in ("true", "false", "null"):
            t = '"' + t + '"'
        out.append(t)
    return json.loads("".join(out))
