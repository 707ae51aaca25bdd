"""bfbs.py - read the binary schemas (.bfbs) that `flatc --schema -b` writes.

A .bfbs is a FlatBuffer of flatc 2.0.8's reflection.fbs (Schema, Object,
Field, Type, Enum, EnumVal, KeyValue); this reads the parts the descriptor
generator and its test need, by slot, with no dependency beyond the standard
library. Slots are the field ids of reflection.fbs (reflection_generated.h's
VT_ constants are 4 + 2 * slot).
"""

import os
import struct
import subprocess
import tempfile

# reflection.fbs BaseType
NONE, UTYPE, BOOL, BYTE, UBYTE, SHORT, USHORT, INT, UINT, LONG, ULONG, FLOAT, DOUBLE, \
    STRING, VECTOR, OBJ, UNION, ARRAY = range(18)
SCALAR_SIZE = {UTYPE: 1, BOOL: 1, BYTE: 1, UBYTE: 1, SHORT: 2, USHORT: 2, INT: 4, UINT: 4,
               LONG: 8, ULONG: 8, FLOAT: 4, DOUBLE: 8}


class Table:
    """A table at pos in buf; getters take the field's slot (its id)."""

    def __init__(self, buf, pos):
        self.buf = buf
        self.pos = pos
        self.vt = pos - struct.unpack_from('<i', buf, pos)[0]
        self.vtlen = struct.unpack_from('<H', buf, self.vt)[0]

    def _off(self, slot):
        o = 4 + 2 * slot
        return struct.unpack_from('<H', self.buf, self.vt + o)[0] if o < self.vtlen else 0

    def scalar(self, slot, fmt, default=0):
        off = self._off(slot)
        return struct.unpack_from('<' + fmt, self.buf, self.pos + off)[0] if off else default

    def _deref(self, slot):
        off = self._off(slot)
        if not off:
            return None
        p = self.pos + off
        return p + struct.unpack_from('<I', self.buf, p)[0]

    def string(self, slot):
        p = self._deref(slot)
        if p is None:
            return None
        n = struct.unpack_from('<I', self.buf, p)[0]
        return self.buf[p + 4:p + 4 + n].decode()

    def table(self, slot):
        p = self._deref(slot)
        return None if p is None else Table(self.buf, p)

    def tables(self, slot):
        p = self._deref(slot)
        if p is None:
            return []
        n = struct.unpack_from('<I', self.buf, p)[0]
        out = []
        for i in range(n):
            e = p + 4 + 4 * i
            out.append(Table(self.buf, e + struct.unpack_from('<I', self.buf, e)[0]))
        return out


class Type:
    def __init__(self, t):
        self.base = t.scalar(0, 'b', NONE)
        self.element = t.scalar(1, 'b', NONE)
        self.index = t.scalar(2, 'i', -1)
        self.fixed_length = t.scalar(3, 'H', 0)


class Field:
    def __init__(self, t):
        self.name = t.string(0)
        self.type = Type(t.table(1))
        self.id = t.scalar(2, 'H', 0)
        self.offset = t.scalar(3, 'H', 0)
        self.deprecated = bool(t.scalar(6, 'B', 0))
        self.required = bool(t.scalar(7, 'B', 0))
        self.attributes = {kv.string(0): kv.string(1) for kv in t.tables(9)}


class Object:
    def __init__(self, t):
        self.name = t.string(0)  # fully qualified: pipetrain.Control
        self.fields = sorted((Field(f) for f in t.tables(1)), key=lambda f: f.id)
        self.is_struct = bool(t.scalar(2, 'B', 0))
        self.minalign = t.scalar(3, 'i', 0)
        self.bytesize = t.scalar(4, 'i', 0)
        self.attributes = {kv.string(0): kv.string(1) for kv in t.tables(5)}
        self.file = t.string(7)  # "//stage.fbs" with --bfbs-filenames

    @property
    def short(self):
        return self.name.rsplit('.', 1)[-1]


class EnumVal:
    def __init__(self, t):
        self.name = t.string(0)
        self.value = t.scalar(1, 'q', 0)
        ut = t.table(3)
        self.union_type = Type(ut) if ut is not None else None


class Enum:
    def __init__(self, t):
        self.name = t.string(0)
        self.values = sorted((EnumVal(v) for v in t.tables(1)), key=lambda v: v.value)
        self.is_union = bool(t.scalar(2, 'B', 0))
        self.file = t.string(6)

    @property
    def short(self):
        return self.name.rsplit('.', 1)[-1]


class Schema:
    def __init__(self, buf):
        root = Table(buf, struct.unpack_from('<I', buf, 0)[0])
        self.objects = [Object(o) for o in root.tables(0)]
        self.enums = [Enum(e) for e in root.tables(1)]
        self.file_ident = root.string(2)
        rt = root.table(4)
        self.root_table = Object(rt).name if rt is not None else None


def file_key(path):
    """The declaration_file flatc writes for path with --bfbs-filenames at its folder."""
    return '//' + os.path.basename(path)


def compile_schema(flatc, fbs, workdir=None):
    """Runs flatc on fbs (includes resolved next to it) and returns its Schema."""
    with tempfile.TemporaryDirectory(dir=workdir) as out:
        folder = os.path.dirname(os.path.abspath(fbs))
        subprocess.run([flatc, '--schema', '-b', '--bfbs-builtins', '--bfbs-filenames', folder,
                        '-I', folder, '-o', out, fbs], check=True)
        name = os.path.splitext(os.path.basename(fbs))[0] + '.bfbs'
        with open(os.path.join(out, name), 'rb') as f:
            return Schema(f.read())
