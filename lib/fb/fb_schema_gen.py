#!/usr/bin/env python3
"""fb_schema_gen.py - pt_fb descriptor tables and field ids from schema/*.fbs.

Usage: fb_schema_gen.py FLATC OUT.h OUT.c SCHEMA.fbs...

Compiles each schema with `flatc --schema -b` and writes, for every table and
struct declared in it (file stem S, type T, field F, all upper snake case):
  - PT_FB_S_T_F: the field's id. A union field U takes two ids, as flatc
    declares it: PT_FB_S_T_U_TYPE (the u8 type; what pt_fb_add_union,
    pt_fb_get_union and the descriptor use) and PT_FB_S_T_U (the value);
  - PT_FB_S_U_M: the type value of member M of union U (NONE is 0), and
    PT_FB_S_U_MEMBERS their count;
  - pt_fb_s_t_desc: the verifier descriptor listing every field (lower snake);
  - PT_FB_S_T_SIZE, _ALIGN and PT_FB_S_T_F_OFFSET for a struct;
  - PT_FB_S_FILE_ID for a schema with a file_identifier;
  - pt_fb_schema_tables[]: every descriptor with its schema, for tests.
Constructs lib/fb cannot verify (vectors of unions, fixed-size arrays, unions
of structs or strings, nested_flatbuffer) stop the build with an error rather
than leave bytes unverified.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bfbs  # noqa: E402


def snake(name):
    s = re.sub(r'([a-z0-9])([A-Z])', r'\1_\2', name)
    s = re.sub(r'([A-Z]+)([A-Z][a-z])', r'\1_\2', s)
    return s.lower()


def fail(msg):
    sys.stderr.write('fb_schema_gen: ' + msg + '\n')
    sys.exit(1)


class Gen:
    def __init__(self, flatc, schemas):
        self.files = []  # (stem, path, Schema)
        for path in schemas:
            stem = os.path.splitext(os.path.basename(path))[0]
            self.files.append((stem, path, bfbs.compile_schema(flatc, path)))
        self.stem_of = {bfbs.file_key(p): s for s, p, _ in self.files}

    def owner(self, decl_file, what):
        if decl_file not in self.stem_of:
            fail('%s is declared in %s, which is not among the schemas given' % (what, decl_file))
        return self.stem_of[decl_file]

    def cname(self, stem, obj):
        return 'pt_fb_%s_%s_desc' % (stem, snake(obj.short))

    def ref(self, schema, index):
        o = schema.objects[index]
        return o, self.owner(o.file, o.name)

    def field_desc(self, stem, schema, obj, f):
        """The initializer of one pt_fb_field_desc, or None for a union's _type."""
        t = f.type
        where = '%s.fbs: %s.%s' % (stem, obj.short, f.name)
        if 'nested_flatbuffer' in f.attributes:
            fail(where + ': nested_flatbuffer is not supported by lib/fb\'s verifier')
        req = 'true' if f.required else 'false'
        idn = self.enum_name(stem, obj, f.name)
        if t.base in bfbs.SCALAR_SIZE:
            if t.base == bfbs.UTYPE:
                return None
            size = bfbs.SCALAR_SIZE[t.base]
            return 'PT_FB_FIELD_SCALAR(%s, "%s", %d)' % (idn, f.name, size)
        if t.base == bfbs.STRING:
            return 'PT_FB_FIELD_STRING(%s, "%s", %s)' % (idn, f.name, req)
        if t.base == bfbs.OBJ:
            o, ostem = self.ref(schema, t.index)
            if o.is_struct:
                if f.required:  # Google's VerifyFieldRequired
                    return ('{.name = "%s", .id = %s, .kind = PT_FB_SCALAR, .required = true, '
                            '.size = %d, .align = %d}' % (f.name, idn, o.bytesize, o.minalign))
                return 'PT_FB_FIELD_STRUCT(%s, "%s", %d, %d)' % (idn, f.name, o.bytesize,
                                                                  o.minalign)
            return 'PT_FB_FIELD_TABLE(%s, "%s", &%s, %s)' % (idn, f.name,
                                                             self.cname(ostem, o), req)
        if t.base == bfbs.UNION:
            e = schema.enums[t.index]
            ustem = self.owner(e.file, e.name)
            return 'PT_FB_FIELD_UNION(%s_TYPE, "%s", &pt_fb_%s_%s_union, %s)' % (
                idn, f.name, ustem, snake(e.short), req)
        if t.base == bfbs.VECTOR:
            if t.element in bfbs.SCALAR_SIZE and t.element != bfbs.UTYPE:
                size = bfbs.SCALAR_SIZE[t.element]
                return 'PT_FB_FIELD_VECTOR(%s, "%s", %d, %d, %s)' % (idn, f.name, size, size,
                                                                     req)
            if t.element == bfbs.STRING:
                return 'PT_FB_FIELD_VECTOR_STRING(%s, "%s", %s)' % (idn, f.name, req)
            if t.element == bfbs.OBJ:
                o, ostem = self.ref(schema, t.index)
                if o.is_struct:
                    return 'PT_FB_FIELD_VECTOR(%s, "%s", %d, %d, %s)' % (
                        idn, f.name, o.bytesize, o.minalign, req)
                return 'PT_FB_FIELD_VECTOR_TABLE(%s, "%s", &%s, %s)' % (
                    idn, f.name, self.cname(ostem, o), req)
            fail(where + ': vectors of unions are not supported by lib/fb\'s verifier')
        fail(where + ': base type %d (fixed-size array?) is not supported by lib/fb' % t.base)

    def enum_name(self, stem, obj, field):
        return 'PT_FB_%s_%s_%s' % (stem.upper(), snake(obj.short).upper(),
                                   snake(field).upper())

    def run(self, out_h, out_c):
        h, c = [], []
        guard = 'PT_FB_SCHEMA_H'
        head = ('/* %%s - generated from %s by lib/fb/fb_schema_gen.py:\n * do not edit. */\n'
                % ' '.join('schema/%s.fbs' % s for s, _, _ in self.files))
        h.append(head % os.path.basename(out_h))
        h.append('#ifndef %s\n#define %s\n\n#include "fb.h"\n' % (guard, guard))
        c.append(head % os.path.basename(out_c))
        c.append('#include "%s"\n' % os.path.basename(out_h))
        entries = []
        names = set()
        for stem, path, schema in self.files:
            key = bfbs.file_key(path)
            h.append('\n/* ---- schema/%s.fbs ---- */\n' % stem)
            c.append('\n/* ---- schema/%s.fbs ---- */\n' % stem)
            if schema.file_ident and schema.objects and \
                    any(o.name == schema.root_table and o.file == key for o in schema.objects):
                h.append('#define PT_FB_%s_FILE_ID "%s"\n' % (stem.upper(), schema.file_ident))
            for e in schema.enums:
                if e.file != key or not e.is_union:
                    continue
                members = []
                for v in e.values:
                    if v.value == 0:
                        continue
                    if v.union_type is None or v.union_type.base != bfbs.OBJ or \
                            schema.objects[v.union_type.index].is_struct:
                        fail('%s.fbs: union %s: member %s is not a table' %
                             (stem, e.short, v.name))
                    if v.value != len(members) + 1:
                        fail('%s.fbs: union %s: member values must be 1, 2, ...' %
                             (stem, e.short))
                    o, ostem = self.ref(schema, v.union_type.index)
                    members.append('&' + self.cname(ostem, o))
                    h.append('#define PT_FB_%s_%s_%s %d\n' % (
                        stem.upper(), snake(e.short).upper(), snake(v.name).upper(), v.value))
                uname = 'pt_fb_%s_%s_union' % (stem, snake(e.short))
                h.append('#define PT_FB_%s_%s_MEMBERS %d\n' % (
                    stem.upper(), snake(e.short).upper(), len(members)))
                h.append('extern const pt_fb_union_desc %s;\n' % uname)
                c.append('static const pt_fb_table_desc *const %s_members[] = {\n' % uname)
                c.extend('    %s,\n' % m for m in members)
                c.append('};\n')
                c.append('const pt_fb_union_desc %s = {\n    .name = "%s", .count = %d, '
                         '.members = %s_members};\n' % (uname, e.short, len(members), uname))
            for o in schema.objects:
                if o.file != key:
                    continue
                if o.is_struct:
                    up = 'PT_FB_%s_%s' % (stem.upper(), snake(o.short).upper())
                    h.append('/* struct %s */\n#define %s_SIZE %d\n#define %s_ALIGN %d\n' % (
                        o.short, up, o.bytesize, up, o.minalign))
                    for f in o.fields:
                        h.append('#define %s_%s_OFFSET %d\n' % (up, snake(f.name).upper(),
                                                                 f.offset))
                    continue
                fields = [f for f in o.fields if not f.deprecated]
                h.append('/* table %s */\n' % o.short)
                if o.fields:
                    h.append('enum {\n')
                for f in o.fields:
                    n = self.enum_name(stem, o, f.name)
                    if n in names:
                        fail('%s.fbs: %s: generated name %s is not unique' % (stem, o.short, n))
                    names.add(n)
                    h.append('\t%s = %d,\n' % (n, f.id))
                if o.fields:
                    h.append('};\n')
                d = self.cname(stem, o)
                h.append('extern const pt_fb_table_desc %s;\n' % d)
                inits = [x for x in (self.field_desc(stem, schema, o, f) for f in fields) if x]
                if inits:
                    c.append('static const pt_fb_field_desc %s_fields[] = {\n' % d)
                    c.extend('    %s,\n' % x for x in inits)
                    c.append('};\n')
                    c.append('const pt_fb_table_desc %s = PT_FB_TABLE_DESC("%s", %s_fields);\n' %
                             (d, o.short, d))
                else:
                    c.append('const pt_fb_table_desc %s = {.name = "%s", .fields = NULL, '
                             '.nfields = 0};\n' % (d, o.short))
                entries.append((stem, o.short, d))
        h.append('\n/* pt_fb_schema_table names one generated descriptor (for tests). */\n'
                 'typedef struct pt_fb_schema_table {\n\tconst char *schema; /* file stem */\n'
                 '\tconst char *name;\n\tconst pt_fb_table_desc *desc;\n} pt_fb_schema_table;\n'
                 '#define PT_FB_SCHEMA_NTABLES %d\n'
                 'extern const pt_fb_schema_table pt_fb_schema_tables[PT_FB_SCHEMA_NTABLES];\n'
                 '\n#endif\n' % len(entries))
        c.append('\nconst pt_fb_schema_table pt_fb_schema_tables[PT_FB_SCHEMA_NTABLES] = {\n')
        c.extend('    {"%s", "%s", &%s},\n' % e for e in entries)
        c.append('};\n')
        for path, text in ((out_h, h), (out_c, c)):
            with open(path, 'w') as f:
                f.write(''.join(text))


def main(argv):
    if len(argv) < 5:
        fail('usage: fb_schema_gen.py FLATC OUT.h OUT.c SCHEMA.fbs...')
    Gen(argv[1], argv[4:]).run(argv[2], argv[3])


if __name__ == '__main__':
    main(sys.argv)
