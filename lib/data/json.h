/* json.h - a small strict JSON parser (RFC 8259) with a DOM, and a writer.
 *
 * Strict means: no comments, trailing commas, NaN/Infinity, leading zeros,
 * single quotes, raw control characters in strings, invalid UTF-8, lone
 * surrogates, duplicate object keys, or trailing garbage. Errors are
 * PT_ERR_FORMAT with "line L, column C" (1-based; column counts bytes) and
 * PT_ERR_RANGE for a broken limit. The parser is re-entrant; a parsed document
 * is read-only and may be read from several threads.
 *
 * Numbers keep both a double and, when the value is an integer that int64_t
 * holds exactly, the exact int64_t (so 2^63-1 or a byte offset never rounds).
 * Numbers are converted with strtod: the process must run in the "C" numeric
 * locale (it does unless someone calls setlocale).
 */
#ifndef PT_JSON_H
#define PT_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef enum pt_json_type {
	PT_JSON_NULL,
	PT_JSON_BOOL,
	PT_JSON_NUMBER,
	PT_JSON_STRING,
	PT_JSON_ARRAY,
	PT_JSON_OBJECT,
} pt_json_type;

typedef struct pt_json_member pt_json_member;

/* One JSON value. The value owns everything it points to. */
typedef struct pt_json {
	pt_json_type type;
	bool boolean;          /* BOOL */
	bool is_int;           /* NUMBER: integral and exactly representable in i */
	int64_t i;             /* NUMBER when is_int */
	double d;              /* NUMBER, always set (large integers may round) */
	char *str;             /* STRING: UTF-8 with a NUL after len bytes; \u0000 may embed NULs */
	size_t len;            /* STRING: bytes; ARRAY and OBJECT: element count */
	struct pt_json *items; /* ARRAY: len values */
	pt_json_member *members; /* OBJECT: len members in document order, keys unique */
} pt_json;

struct pt_json_member {
	char *key; /* UTF-8, NUL after key_len bytes */
	size_t key_len;
	pt_json value;
};

/* Limits for untrusted input; a zero field takes the default. */
typedef struct pt_json_limits {
	size_t max_bytes;  /* input length, default 64 MiB */
	int max_depth;     /* nesting of arrays and objects, default 64 */
	size_t max_values; /* values in the document, default 16 Mi */
} pt_json_limits;

/* pt_json_parse parses len bytes of text (no NUL needed) into *out, which the
 * caller releases with pt_json_fini. lim may be NULL for the defaults. On error
 * *out is a JSON null (pt_json_fini is still safe) and the message says where. */
pt_err pt_json_parse(pt_json *out, const char *text, size_t len, const pt_json_limits *lim);

/* pt_json_fini frees everything v owns and makes it a null. NULL-safe. */
void pt_json_fini(pt_json *v);

/* pt_json_type_name returns "null", "boolean", "number", "string", "array", "object". */
const char *pt_json_type_name(pt_json_type t);

/* pt_json_get returns the member value of object obj named key, or NULL when
 * obj is not an object or has no such key. Linear in the member count. */
const pt_json *pt_json_get(const pt_json *obj, const char *key);

/* pt_json_at returns element i of array arr, or NULL when out of range or arr
 * is not an array. */
const pt_json *pt_json_at(const pt_json *arr, size_t i);

/* pt_json_string returns v's string, or NULL when v is NULL or not a string. */
const char *pt_json_string(const pt_json *v);

/* pt_json_int stores v's exact integer in *out and returns true, or returns
 * false when v is NULL, not a number, or not an exact integer. */
bool pt_json_int(const pt_json *v, int64_t *out);

/* A growable byte buffer, always NUL-terminated once anything was appended.
 * Caller-embedded: pt_buf_init, then pt_buf_fini. */
typedef struct pt_buf {
	char *data;
	size_t len, cap;
} pt_buf;

/* pt_buf_init makes b empty; it allocates on the first append. */
void pt_buf_init(pt_buf *b);
/* pt_buf_fini frees the bytes. NULL-safe. */
void pt_buf_fini(pt_buf *b);
/* pt_buf_append adds n bytes; PT_ERR_NOMEM leaves b as it was. */
pt_err pt_buf_append(pt_buf *b, const void *data, size_t n);
/* pt_buf_printf appends formatted text. */
pt_err pt_buf_printf(pt_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* pt_json_write_string appends s[len] as a quoted JSON string: '"', '\\' and
 * control characters are escaped, other bytes are copied (s should be UTF-8). */
pt_err pt_json_write_string(pt_buf *b, const char *s, size_t len);

/* pt_json_write appends v as compact JSON; integers print exactly, other
 * numbers with 17 significant digits (PT_ERR_INVALID for a non-finite one). */
pt_err pt_json_write(pt_buf *b, const pt_json *v);

#endif
