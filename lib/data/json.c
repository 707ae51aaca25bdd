/* json.c - recursive-descent JSON parser (depth-limited), DOM, writer. */
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_DEFAULT_BYTES  ((size_t)64 << 20)
#define JSON_DEFAULT_DEPTH  64
#define JSON_DEFAULT_VALUES ((size_t)16 << 20)
#define JSON_MAX_NUMBER     400 /* characters in one number literal */

typedef struct json_parser {
	const char *start, *p, *end;
	int depth, max_depth;
	size_t values, max_values;
} json_parser;

/* json_error sets PT_ERR_FORMAT with the line and column of position at. */
static pt_err __attribute__((format(printf, 3, 4)))
json_error(const json_parser *ps, const char *at, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	int line = 1, col = 1;

	for (const char *q = ps->start; q < at && q < ps->end; q++) {
		if (*q == '\n')
			line++, col = 1;
		else
			col++;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return pt_set_error(PT_ERR_FORMAT, "json: line %d, column %d: %s", line, col, msg);
}

static void skip_ws(json_parser *ps)
{
	while (ps->p < ps->end &&
	       (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static pt_err parse_value(json_parser *ps, pt_json *v);

static pt_err count_value(json_parser *ps)
{
	if (++ps->values > ps->max_values)
		return pt_set_error(PT_ERR_RANGE, "json: more than %zu values", ps->max_values);
	return PT_OK;
}

static int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* read_hex4 reads the 4 hex digits of a \u escape at ps->p. */
static pt_err read_hex4(json_parser *ps, uint32_t *out)
{
	uint32_t x = 0;
	if (ps->end - ps->p < 4)
		return json_error(ps, ps->p, "truncated \\u escape");
	for (int i = 0; i < 4; i++) {
		int h = hex_digit(ps->p[i]);
		if (h < 0)
			return json_error(ps, ps->p + i, "bad hex digit in \\u escape");
		x = x << 4 | (uint32_t)h;
	}
	ps->p += 4;
	*out = x;
	return PT_OK;
}

/* utf8_len validates one UTF-8 sequence at p (RFC 3629: no overlongs, no
 * surrogates, at most U+10FFFF) and returns its length, or 0 when invalid. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
	unsigned char c = p[0];
	size_t n;
	uint32_t cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, cp = c & 0x07;
	else
		return 0;
	if ((size_t)(end - p) < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

static size_t utf8_put(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* parse_string decodes the string at ps->p (which is at the opening quote)
 * into a new NUL-terminated buffer. Decoded text is never longer than the
 * source, so one allocation of the source length is enough. */
static pt_err parse_string(json_parser *ps, char **out, size_t *out_len)
{
	const char *q, *open = ps->p;
	char *buf, *o;
	pt_err rv;

	ps->p++;
	for (q = ps->p; q < ps->end && *q != '"'; q++)
		if (*q == '\\' && q + 1 < ps->end)
			q++;
	if (q >= ps->end)
		return json_error(ps, open, "unterminated string");
	buf = malloc((size_t)(q - ps->p) + 1);
	if (buf == NULL)
		return pt_set_error(PT_ERR_NOMEM, "json: string of %zu bytes", (size_t)(q - ps->p));
	o = buf;
	while (*ps->p != '"') {
		unsigned char c = (unsigned char)*ps->p;
		if (c < 0x20) {
			rv = json_error(ps, ps->p, "control character 0x%02x in string", c);
			goto fail;
		}
		if (c >= 0x80) {
			size_t n =
			    utf8_len((const unsigned char *)ps->p, (const unsigned char *)ps->end);
			if (n == 0) {
				rv = json_error(ps, ps->p, "invalid UTF-8 in string");
				goto fail;
			}
			memcpy(o, ps->p, n);
			o += n, ps->p += n;
			continue;
		}
		if (c != '\\') {
			*o++ = (char)c;
			ps->p++;
			continue;
		}
		ps->p++;
		switch (*ps->p++) {
		case '"':
			*o++ = '"';
			break;
		case '\\':
			*o++ = '\\';
			break;
		case '/':
			*o++ = '/';
			break;
		case 'b':
			*o++ = '\b';
			break;
		case 'f':
			*o++ = '\f';
			break;
		case 'n':
			*o++ = '\n';
			break;
		case 'r':
			*o++ = '\r';
			break;
		case 't':
			*o++ = '\t';
			break;
		case 'u': {
			uint32_t cp, lo;
			const char *esc = ps->p - 2;
			if ((rv = read_hex4(ps, &cp)) != PT_OK)
				goto fail;
			if (cp >= 0xdc00 && cp <= 0xdfff) {
				rv = json_error(ps, esc, "lone low surrogate \\u%04x", cp);
				goto fail;
			}
			if (cp >= 0xd800 && cp <= 0xdbff) {
				if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
					rv = json_error(ps, esc,
					                "high surrogate \\u%04x without a low one",
					                cp);
					goto fail;
				}
				ps->p += 2;
				if ((rv = read_hex4(ps, &lo)) != PT_OK)
					goto fail;
				if (lo < 0xdc00 || lo > 0xdfff) {
					rv = json_error(
					    ps, esc, "high surrogate \\u%04x followed by \\u%04x",
					    cp, lo);
					goto fail;
				}
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			}
			o += utf8_put(o, cp);
			break;
		}
		default:
			rv = json_error(ps, ps->p - 1, "invalid escape '\\%c'", ps->p[-1]);
			goto fail;
		}
	}
	ps->p++; /* closing quote */
	*o = '\0';
	*out = buf;
	*out_len = (size_t)(o - buf);
	return PT_OK;
fail:
	free(buf);
	return rv;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static pt_err parse_number(json_parser *ps, pt_json *v)
{
	const char *s = ps->p, *q = ps->p;
	char tmp[JSON_MAX_NUMBER + 1];
	bool integral = true;
	size_t n;

	if (q < ps->end && *q == '-')
		q++;
	if (q >= ps->end || !is_digit(*q))
		return json_error(ps, q, "expected a digit");
	if (*q == '0' && q + 1 < ps->end && is_digit(q[1]))
		return json_error(ps, q, "leading zero in a number");
	while (q < ps->end && is_digit(*q))
		q++;
	if (q < ps->end && *q == '.') {
		integral = false;
		if (++q >= ps->end || !is_digit(*q))
			return json_error(ps, q, "expected a digit after '.'");
		while (q < ps->end && is_digit(*q))
			q++;
	}
	if (q < ps->end && (*q == 'e' || *q == 'E')) {
		integral = false;
		q++;
		if (q < ps->end && (*q == '+' || *q == '-'))
			q++;
		if (q >= ps->end || !is_digit(*q))
			return json_error(ps, q, "expected a digit in the exponent");
		while (q < ps->end && is_digit(*q))
			q++;
	}
	n = (size_t)(q - s);
	if (n > JSON_MAX_NUMBER)
		return json_error(ps, s, "number longer than %d characters", JSON_MAX_NUMBER);
	memcpy(tmp, s, n);
	tmp[n] = '\0';
	v->type = PT_JSON_NUMBER;
	v->d = strtod(tmp, NULL);
	if (isinf(v->d))
		return json_error(ps, s, "number out of the range of a double");
	if (integral) {
		errno = 0;
		long long x = strtoll(tmp, NULL, 10);
		if (errno == 0) {
			v->is_int = true;
			v->i = x;
		}
	} else if (v->d == floor(v->d) && fabs(v->d) <= 9007199254740992.0) {
		/* 1e3 or 2.0: integral, and exact because |d| <= 2^53. */
		v->is_int = true;
		v->i = (int64_t)v->d;
	}
	ps->p = q;
	return PT_OK;
}

static pt_err parse_array(json_parser *ps, pt_json *v)
{
	size_t cap = 0;
	pt_err rv;

	v->type = PT_JSON_ARRAY;
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == ']') {
		ps->p++;
		return PT_OK;
	}
	for (;;) {
		if (v->len == cap) {
			size_t ncap = cap ? cap * 2 : 4;
			pt_json *ni = realloc(v->items, ncap * sizeof(*ni));
			if (ni == NULL)
				return pt_set_error(PT_ERR_NOMEM, "json: array of %zu values",
				                    ncap);
			v->items = ni;
			cap = ncap;
		}
		/* Counted before parsing so pt_json_fini frees a partial child. */
		memset(&v->items[v->len], 0, sizeof(pt_json));
		v->len++;
		if ((rv = parse_value(ps, &v->items[v->len - 1])) != PT_OK)
			return rv;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return json_error(ps, ps->p, "unterminated array");
		if (*ps->p == ']') {
			ps->p++;
			return PT_OK;
		}
		if (*ps->p != ',')
			return json_error(ps, ps->p, "expected ',' or ']' in array");
		ps->p++;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == ']')
			return json_error(ps, ps->p, "trailing comma in array");
	}
}

static int member_cmp(const void *a, const void *b)
{
	const pt_json_member *x = *(const pt_json_member *const *)a;
	const pt_json_member *y = *(const pt_json_member *const *)b;
	size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
	int c = memcmp(x->key, y->key, n);
	if (c != 0)
		return c;
	return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* check_unique_keys sorts pointers to the members (O(n log n), so a huge
 * header cannot make the check quadratic) and compares neighbours. */
static pt_err check_unique_keys(json_parser *ps, const pt_json *v, const char *at)
{
	const pt_json_member **sorted;
	pt_err rv = PT_OK;

	if (v->len < 2)
		return PT_OK;
	sorted = malloc(v->len * sizeof(*sorted));
	if (sorted == NULL)
		return pt_set_error(PT_ERR_NOMEM, "json: key check of %zu members", v->len);
	for (size_t i = 0; i < v->len; i++)
		sorted[i] = &v->members[i];
	qsort(sorted, v->len, sizeof(*sorted), member_cmp);
	for (size_t i = 1; i < v->len && rv == PT_OK; i++)
		if (member_cmp(&sorted[i - 1], &sorted[i]) == 0)
			rv = json_error(ps, at, "duplicate key \"%.200s\" in object",
			                sorted[i]->key);
	free(sorted);
	return rv;
}

static pt_err parse_object(json_parser *ps, pt_json *v)
{
	const char *open = ps->p;
	size_t cap = 0;
	pt_err rv;

	v->type = PT_JSON_OBJECT;
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '}') {
		ps->p++;
		return PT_OK;
	}
	for (;;) {
		pt_json_member *m;
		if (ps->p >= ps->end || *ps->p != '"')
			return json_error(ps, ps->p, "expected a string key in object");
		if (v->len == cap) {
			size_t ncap = cap ? cap * 2 : 4;
			pt_json_member *nm = realloc(v->members, ncap * sizeof(*nm));
			if (nm == NULL)
				return pt_set_error(PT_ERR_NOMEM, "json: object of %zu members",
				                    ncap);
			v->members = nm;
			cap = ncap;
		}
		m = &v->members[v->len];
		memset(m, 0, sizeof(*m));
		if ((rv = parse_string(ps, &m->key, &m->key_len)) != PT_OK)
			return rv;
		v->len++; /* counted now so pt_json_fini frees the key on error */
		skip_ws(ps);
		if (ps->p >= ps->end || *ps->p != ':')
			return json_error(ps, ps->p, "expected ':' after object key");
		ps->p++;
		if ((rv = parse_value(ps, &m->value)) != PT_OK)
			return rv;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return json_error(ps, ps->p, "unterminated object");
		if (*ps->p == '}') {
			ps->p++;
			return check_unique_keys(ps, v, open);
		}
		if (*ps->p != ',')
			return json_error(ps, ps->p, "expected ',' or '}' in object");
		ps->p++;
		skip_ws(ps);
		if (ps->p < ps->end && *ps->p == '}')
			return json_error(ps, ps->p, "trailing comma in object");
	}
}

static bool match_word(json_parser *ps, const char *w)
{
	size_t n = strlen(w);
	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0)
		return false;
	ps->p += n;
	return true;
}

/* parse_value parses one value into v (zeroed by the caller). On error v may
 * hold a partial tree, which the caller frees with pt_json_fini. */
static pt_err parse_value(json_parser *ps, pt_json *v)
{
	pt_err rv;

	PT_TRY(count_value(ps));
	skip_ws(ps);
	if (ps->p >= ps->end)
		return json_error(ps, ps->p, "unexpected end of input, expected a value");
	switch (*ps->p) {
	case '{':
	case '[':
		if (ps->depth >= ps->max_depth)
			return pt_set_error(PT_ERR_RANGE, "json: nesting deeper than %d",
			                    ps->max_depth);
		ps->depth++;
		rv = *ps->p == '{' ? parse_object(ps, v) : parse_array(ps, v);
		ps->depth--;
		return rv;
	case '"':
		v->type = PT_JSON_STRING;
		return parse_string(ps, &v->str, &v->len);
	case 't':
	case 'f':
	case 'n':
		if (match_word(ps, "true")) {
			v->type = PT_JSON_BOOL;
			v->boolean = true;
		} else if (match_word(ps, "false")) {
			v->type = PT_JSON_BOOL;
		} else if (match_word(ps, "null")) {
			v->type = PT_JSON_NULL;
		} else {
			return json_error(ps, ps->p, "invalid literal");
		}
		return PT_OK;
	default:
		if (*ps->p == '-' || is_digit(*ps->p))
			return parse_number(ps, v);
		if ((unsigned char)*ps->p >= 0x20 && (unsigned char)*ps->p < 0x7f)
			return json_error(ps, ps->p, "unexpected character '%c'", *ps->p);
		return json_error(ps, ps->p, "unexpected byte 0x%02x",
		                  (unsigned)(unsigned char)*ps->p);
	}
}

pt_err pt_json_parse(pt_json *out, const char *text, size_t len, const pt_json_limits *lim)
{
	json_parser ps = {0};
	size_t max_bytes = lim && lim->max_bytes ? lim->max_bytes : JSON_DEFAULT_BYTES;
	pt_err rv;

	memset(out, 0, sizeof(*out));
	if (len > max_bytes)
		return pt_set_error(PT_ERR_RANGE,
		                    "json: input of %zu bytes exceeds the limit of %zu", len,
		                    max_bytes);
	ps.start = ps.p = text;
	ps.end = text + len;
	ps.max_depth = lim && lim->max_depth > 0 ? lim->max_depth : JSON_DEFAULT_DEPTH;
	ps.max_values = lim && lim->max_values ? lim->max_values : JSON_DEFAULT_VALUES;
	skip_ws(&ps);
	if (ps.p == ps.end) {
		rv = json_error(&ps, ps.p, "empty input");
	} else if ((rv = parse_value(&ps, out)) == PT_OK) {
		skip_ws(&ps);
		if (ps.p != ps.end)
			rv = json_error(&ps, ps.p, "trailing characters after the value");
	}
	if (rv != PT_OK)
		pt_json_fini(out);
	return rv;
}

void pt_json_fini(pt_json *v)
{
	if (v == NULL)
		return;
	switch (v->type) {
	case PT_JSON_STRING:
		free(v->str);
		break;
	case PT_JSON_ARRAY:
		for (size_t i = 0; i < v->len; i++)
			pt_json_fini(&v->items[i]);
		free(v->items);
		break;
	case PT_JSON_OBJECT:
		for (size_t i = 0; i < v->len; i++) {
			free(v->members[i].key);
			pt_json_fini(&v->members[i].value);
		}
		free(v->members);
		break;
	default:
		break;
	}
	memset(v, 0, sizeof(*v));
}

const char *pt_json_type_name(pt_json_type t)
{
	static const char *const names[] = {"null",   "boolean", "number",
	                                    "string", "array",   "object"};
	return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

const pt_json *pt_json_get(const pt_json *obj, const char *key)
{
	size_t n = strlen(key);
	if (obj == NULL || obj->type != PT_JSON_OBJECT)
		return NULL;
	for (size_t i = 0; i < obj->len; i++)
		if (obj->members[i].key_len == n && memcmp(obj->members[i].key, key, n) == 0)
			return &obj->members[i].value;
	return NULL;
}

const pt_json *pt_json_at(const pt_json *arr, size_t i)
{
	if (arr == NULL || arr->type != PT_JSON_ARRAY || i >= arr->len)
		return NULL;
	return &arr->items[i];
}

const char *pt_json_string(const pt_json *v)
{
	return v && v->type == PT_JSON_STRING ? v->str : NULL;
}

bool pt_json_int(const pt_json *v, int64_t *out)
{
	if (v == NULL || v->type != PT_JSON_NUMBER || !v->is_int)
		return false;
	*out = v->i;
	return true;
}

void pt_buf_init(pt_buf *b)
{
	memset(b, 0, sizeof(*b));
}

void pt_buf_fini(pt_buf *b)
{
	if (b == NULL)
		return;
	free(b->data);
	memset(b, 0, sizeof(*b));
}

static pt_err buf_reserve(pt_buf *b, size_t extra)
{
	size_t need = b->len + extra + 1, ncap;
	char *nd;

	if (need < b->len)
		return pt_set_error(PT_ERR_OVERFLOW, "buffer of %zu + %zu bytes", b->len, extra);
	if (need <= b->cap)
		return PT_OK;
	ncap = b->cap ? b->cap : 64;
	while (ncap < need)
		ncap = ncap * 2 > ncap ? ncap * 2 : need;
	nd = realloc(b->data, ncap);
	if (nd == NULL)
		return pt_set_error(PT_ERR_NOMEM, "buffer of %zu bytes", ncap);
	b->data = nd;
	b->cap = ncap;
	return PT_OK;
}

pt_err pt_buf_append(pt_buf *b, const void *data, size_t n)
{
	PT_TRY(buf_reserve(b, n));
	if (n)
		memcpy(b->data + b->len, data, n);
	b->len += n;
	b->data[b->len] = '\0';
	return PT_OK;
}

pt_err pt_buf_printf(pt_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return pt_set_error(PT_ERR_INVALID, "bad format \"%s\"", fmt);
	PT_TRY(buf_reserve(b, (size_t)n));
	va_start(ap, fmt);
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
	return PT_OK;
}

pt_err pt_json_write_string(pt_buf *b, const char *s, size_t len)
{
	size_t run = 0; /* start of the bytes not yet copied */

	PT_TRY(pt_buf_append(b, "\"", 1));
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[8];
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		PT_TRY(pt_buf_append(b, s + run, i - run));
		run = i + 1;
		switch (c) {
		case '"':
			strcpy(esc, "\\\"");
			break;
		case '\\':
			strcpy(esc, "\\\\");
			break;
		case '\n':
			strcpy(esc, "\\n");
			break;
		case '\r':
			strcpy(esc, "\\r");
			break;
		case '\t':
			strcpy(esc, "\\t");
			break;
		case '\b':
			strcpy(esc, "\\b");
			break;
		case '\f':
			strcpy(esc, "\\f");
			break;
		default:
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			break;
		}
		PT_TRY(pt_buf_append(b, esc, strlen(esc)));
	}
	PT_TRY(pt_buf_append(b, s + run, len - run));
	return pt_buf_append(b, "\"", 1);
}

pt_err pt_json_write(pt_buf *b, const pt_json *v)
{
	switch (v->type) {
	case PT_JSON_NULL:
		return pt_buf_append(b, "null", 4);
	case PT_JSON_BOOL:
		return v->boolean ? pt_buf_append(b, "true", 4) : pt_buf_append(b, "false", 5);
	case PT_JSON_NUMBER:
		if (v->is_int)
			return pt_buf_printf(b, "%" PRId64, v->i);
		if (!isfinite(v->d))
			return pt_set_error(PT_ERR_INVALID, "json: non-finite number %g", v->d);
		/* Above 2^53 a double is integral, and %.17g may print it without
		 * '.' or 'e' (55555555555555552): add ".0" so it reads back as
		 * what it is, not an exact integer (is_int). */
		{
			size_t at = b->len;
			PT_TRY(pt_buf_printf(b, "%.17g", v->d));
			if (strcspn(b->data + at, ".e") == b->len - at)
				return pt_buf_append(b, ".0", 2);
			return PT_OK;
		}
	case PT_JSON_STRING:
		return pt_json_write_string(b, v->str, v->len);
	case PT_JSON_ARRAY:
		PT_TRY(pt_buf_append(b, "[", 1));
		for (size_t i = 0; i < v->len; i++) {
			if (i)
				PT_TRY(pt_buf_append(b, ",", 1));
			PT_TRY(pt_json_write(b, &v->items[i]));
		}
		return pt_buf_append(b, "]", 1);
	case PT_JSON_OBJECT:
		PT_TRY(pt_buf_append(b, "{", 1));
		for (size_t i = 0; i < v->len; i++) {
			if (i)
				PT_TRY(pt_buf_append(b, ",", 1));
			PT_TRY(pt_json_write_string(b, v->members[i].key, v->members[i].key_len));
			PT_TRY(pt_buf_append(b, ":", 1));
			PT_TRY(pt_json_write(b, &v->members[i].value));
		}
		return pt_buf_append(b, "}", 1);
	}
	return pt_set_error(PT_ERR_INVALID, "json: value of unknown type %d", (int)v->type);
}
