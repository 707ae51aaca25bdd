#!/usr/bin/env python3
"""schema_check.py - no table or vector of schema/*.fbs is read unverified.

Usage: schema_check.py SOURCE_ROOT FB_SCHEMA_DUMP FLATC

Compares the verifier descriptors compiled into the build (printed by
fb_schema_dump) with the reflection of every schema, compiled afresh by flatc:
  1. every schema/*.fbs is generated (a new file not listed in lib/fb/meson.build fails);
  2. every table of every schema has a descriptor whose fields are exactly the
     schema's (id, kind, required, inline size and alignment, the nested
     table's descriptor, the union's members), so a field added to a .fbs and
     not picked up by the build fails, and so does a stale build;
  3. from every descriptor the C code verifies with, the tables reachable
     through descriptors are the tables reachable in the schema;
  4. the sources hold no hand-written descriptors (one allowed partial view),
     every pt_fb_verify passes a generated descriptor, and every function that
     takes a root with pt_fb_root verified the buffer first;
  5. the generator refuses what lib/fb cannot verify (nested_flatbuffer,
     vectors of unions) instead of leaving bytes unverified.
Prints each problem and exits 1 if there is any.
"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT, DUMP, FLATC = sys.argv[1:4]
sys.path.insert(0, os.path.join(ROOT, 'lib', 'fb'))
import bfbs  # noqa: E402

# lib/fb's pt_fb_kind
SCALAR, STRING, VECTOR, VECTOR_STRING, VECTOR_TABLE, TABLE, UNION = range(7)

# Hand-written descriptors allowed in the sources: a partial view whose one
# field is checked against the generated id below.
ALLOWED_HAND = {('lib/api/api.c', 'id_only_desc')}
# pt_fb_verify calls whose descriptor argument is not a generated name
# literally: a parameter or table filled only with generated descriptors.
ALLOWED_VERIFY_ARGS = {
    ('lib/pipeline/wire.c', 'desc'),  # verified_root(m, &pt_fb_stage_..._desc)
    ('lib/pipeline/handshake.c', 'reply_desc[kind]'),
    ('lib/api/api.c', '&id_only_desc'),
}
# Functions that take a root without verifying: the buffer is one we built.
ALLOWED_UNVERIFIED_ROOT = {('lib/comm/nng.c', 'patch_seq')}

problems = []


def problem(msg):
    problems.append(msg)
    print('FAIL: ' + msg)


def expected_field(schema, obj, f, key_of):
    """(name, id, kind, required, size, align, table, members) lib/fb must verify."""
    t = f.type
    req = f.required
    if t.base in bfbs.SCALAR_SIZE:
        n = bfbs.SCALAR_SIZE[t.base]
        return (f.name, f.id, SCALAR, False, n, n, None, None)
    if t.base == bfbs.STRING:
        return (f.name, f.id, STRING, req, 0, 0, None, None)
    if t.base == bfbs.OBJ:
        o = schema.objects[t.index]
        if o.is_struct:
            return (f.name, f.id, SCALAR, False, o.bytesize, o.minalign, None, None)
        return (f.name, f.id, TABLE, req, 0, 0, key_of(o), None)
    if t.base == bfbs.UNION:
        e = schema.enums[t.index]
        members = tuple(key_of(schema.objects[v.union_type.index])
                        for v in e.values if v.value != 0)
        return (f.name, f.id - 1, UNION, req, 0, 0, None, members)
    if t.base == bfbs.VECTOR:
        if t.element in bfbs.SCALAR_SIZE:
            n = bfbs.SCALAR_SIZE[t.element]
            return (f.name, f.id, VECTOR, req, n, n, None, None)
        if t.element == bfbs.STRING:
            return (f.name, f.id, VECTOR_STRING, req, 0, 0, None, None)
        o = schema.objects[t.index]
        if o.is_struct:
            return (f.name, f.id, VECTOR, req, o.bytesize, o.minalign, None, None)
        return (f.name, f.id, VECTOR_TABLE, req, 0, 0, key_of(o), None)
    return (f.name, f.id, 'unsupported base type %d' % t.base, req, 0, 0, None, None)


def compiled_field(d, tables):
    key = lambda i: None if i < 0 else (tables[i]['schema'], tables[i]['name'])  # noqa: E731
    size, align = d['size'], d['align']
    if d['kind'] not in (SCALAR, VECTOR):
        size = align = 0
    nested = key(d['table']) if d['kind'] in (TABLE, VECTOR_TABLE) else None
    members = tuple(key(m) for m in d['members']) if d['kind'] == UNION else None
    return (d['name'], d['id'], d['kind'], d['required'], size, align, nested, members)


def main():
    tables = json.loads(subprocess.run([DUMP], check=True, capture_output=True,
                                       text=True).stdout)
    by_key = {(t['schema'], t['name']): i for i, t in enumerate(tables)}
    for t in tables:
        if t['desc_name'] != t['name']:
            problem('descriptor %s.%s is named "%s"' % (t['schema'], t['name'], t['desc_name']))

    # 1. every schema file is generated
    files = sorted(glob.glob(os.path.join(ROOT, 'schema', '*.fbs')))
    stems = {os.path.splitext(os.path.basename(p))[0]: p for p in files}
    generated = {t['schema'] for t in tables}
    for s in sorted(set(stems) - generated):
        problem('schema/%s.fbs has no generated descriptors (add it to lib/fb/meson.build)' % s)

    # 2. every table's descriptor matches its schema
    reach_schema = {}  # (stem, table) -> set of (stem, table) one step below
    seen = set()
    for stem, path in sorted(stems.items()):
        schema = bfbs.compile_schema(FLATC, path)
        key_of = lambda o: (os.path.splitext(o.file[2:])[0], o.short)  # noqa: E731
        for o in schema.objects:
            if o.is_struct:
                continue
            k = key_of(o)
            if k in seen:
                continue
            seen.add(k)
            want = sorted(expected_field(schema, o, f, key_of) for f in o.fields
                          if not f.deprecated and f.type.base != bfbs.UTYPE)
            reach_schema[k] = {x[6] for x in want if x[6]} | \
                {m for x in want if x[7] for m in x[7]}
            if k not in by_key:
                problem('table %s.%s has no generated descriptor' % k)
                continue
            got = sorted(compiled_field(d, tables) for d in tables[by_key[k]]['fields'])
            for x in sorted(set(want) - set(got)):
                problem('%s.%s: field %r is not verified as the schema says' % (k + (x,)))
            for x in sorted(set(got) - set(want)):
                problem('%s.%s: descriptor field %r is not in the schema' % (k + (x,)))
    for k in sorted(set(by_key) - seen):
        problem('descriptor %s.%s has no table in the schemas' % k)

    # 3. roots used by the C code reach what their schema reaches
    sources = []
    for folder in ('lib', 'server', 'client', 'tools', 'bench'):
        sources += glob.glob(os.path.join(ROOT, folder, '**', '*.c'), recursive=True)
        sources += glob.glob(os.path.join(ROOT, folder, '**', '*.h'), recursive=True)
    names = {'pt_fb_%s_%s_desc' % (t['schema'], re.sub(r'([a-z0-9])([A-Z])', r'\1_\2',
                                                         t['name']).lower()): (t['schema'],
                                                                               t['name'])
             for t in tables}
    roots = set()
    for src in sources:
        rel = os.path.relpath(src, ROOT)
        text = open(src).read()
        for m in re.finditer(r'&(pt_fb_\w+_desc)\b', text):
            if m.group(1) in names:
                roots.add(names[m.group(1)])
        # 4a. no hand-written descriptors
        for m in re.finditer(r'\bpt_fb_table_desc\s+(\w+)\s*=', text):
            if (rel, m.group(1)) not in ALLOWED_HAND:
                problem('%s: hand-written descriptor %s (generate it from the schema)' %
                        (rel, m.group(1)))
        if rel.startswith('lib/fb/'):
            continue
        for m in re.finditer(r'\bpt_fb_(field|union)_desc\s+(\w+)\[?\]?\s*=', text):
            if not any(rel == a for a, _ in ALLOWED_HAND):
                problem('%s: hand-written pt_fb_%s_desc %s' % (rel, m.group(1), m.group(2)))
        # 4b. pt_fb_verify gets a generated descriptor
        for m in re.finditer(r'\bpt_fb_verify\(([^;]*?)\)\s*[;!=)]', text, re.S):
            args = [a.strip() for a in re.split(r',(?![^\[]*\])', m.group(1))]
            if len(args) < 3:
                continue
            arg = args[2]
            lit = re.fullmatch(r'&(pt_fb_\w+_desc)', arg)
            if lit and lit.group(1) in names:
                continue
            if (rel, arg) not in ALLOWED_VERIFY_ARGS:
                problem('%s: pt_fb_verify(..., %s, ...) is not a generated descriptor' %
                        (rel, arg))
        # 4c. a root is taken only after verification, in the same function
        for m in re.finditer(r'^\w[^\n;]*?\b(\w+)\(([^)]*)\)\s*\n\{(.*?)^\}', text, re.S | re.M):
            fn, body = m.group(1), m.group(3)
            i = body.find('pt_fb_root(')
            if i < 0 or (rel, fn) in ALLOWED_UNVERIFIED_ROOT:
                continue
            before = body[:i]
            if 'pt_fb_verify(' not in before and 'verified_root(' not in before:
                problem('%s: %s() takes pt_fb_root() of a buffer it did not verify' % (rel, fn))
    if os.path.exists(os.path.join(ROOT, 'lib/api/api.c')):
        text = open(os.path.join(ROOT, 'lib/api/api.c')).read()
        if 'PT_FB_FIELD_SCALAR(PT_FB_API_REQUEST_ID, "id", 8)' not in text:
            problem('lib/api/api.c: id_only_desc is not Request.id as generated')
    for must in (('api', 'Request'), ('api', 'Response'), ('job', 'JobSpec'),
                 ('stage', 'Control'), ('stage', 'Reply'), ('stage', 'StageError'),
                 ('stage', 'TensorFrame'), ('stage', 'WorkerRequest')):
        if must not in roots:
            problem('%s.%s is not verified by any source (expected a wire root)' % must)
    def key_i(i):
        return (tables[i]['schema'], tables[i]['name']) if i >= 0 else ('?', 'hand-written')

    for root in sorted(roots):
        def closure(graph, start):
            out, todo = set(), [start]
            while todo:
                k = todo.pop()
                if k in out:
                    continue
                out.add(k)
                todo.extend(graph.get(k, ()))
            return out
        graph_c = {}
        for t in tables:
            below = graph_c.setdefault((t['schema'], t['name']), set())
            for d in t['fields']:
                if d['kind'] in (TABLE, VECTOR_TABLE):
                    below.add(key_i(d['table']))
                below.update(key_i(i) for i in d['members'] or [])
        want, got = closure(reach_schema, root), closure(graph_c, root)
        if want != got:
            problem('root %s.%s: schema reaches %s, descriptors reach %s' %
                    (root + (sorted(want - got), sorted(got - want))))

    # 5. the generator refuses what lib/fb cannot verify
    gen = os.path.join(ROOT, 'lib', 'fb', 'fb_schema_gen.py')
    bad = {
        'nested': 'table A { x: int; }\ntable B { a: [ubyte] (nested_flatbuffer: "A"); }\n',
        'union_vector': 'table A { x: int; }\nunion U { A }\ntable B { u: [U]; }\n',
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in bad.items():
            fbs = os.path.join(tmp, name + '.fbs')
            with open(fbs, 'w') as f:
                f.write('namespace t;\n' + text)
            r = subprocess.run([sys.executable, gen, FLATC, os.path.join(tmp, 'x.h'),
                                os.path.join(tmp, 'x.c'), fbs], capture_output=True, text=True)
            if r.returncode == 0 or 'not supported' not in r.stderr:
                problem('generator accepted %s (rc %d, %s)' % (name, r.returncode,
                                                               r.stderr.strip()))

    print('%d tables, %d roots checked; %d problems' % (len(tables), len(roots), len(problems)))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
