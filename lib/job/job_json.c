/* job_json.c - the JSON text of a JobSpec (flatc's JSON for schema/job.fbs)
 * into a pt_job_spec and a JobSpec table; job files of either kind.
 *
 * The schema is described once, as data: one row per field (name, type, where
 * it lands in the C struct, its enum names or nested table). The reader is
 * driven by it, token by token, and accepts what `flatc -b` 2.0.8 accepts for
 * these types (tests/test_job.c holds the table of cases, checked against
 * flatc): comments (// and block), trailing commas, keys without quotes or in
 * single quotes, strings in single quotes, enums by name (bare or quoted) or
 * number, booleans as true/false or 0 to 255, numbers in quotes ("0.1"), hex
 * integers (0x10) and floats (0x1p-3), inf and nan, a UTF-8 BOM, and null for
 * a string, table or vector (absent). Like flatc it refuses `#` comments, a
 * field given twice, unknown fields, a fraction or exponent for an integer
 * field, null for a scalar and a missing required field. Unlike flatc it
 * refuses enum values the schema does not declare (a number past the last
 * name, or names ORed in one string; flatc stores them, the server refuses
 * them) and NUL characters in strings (the spec keeps C strings). Errors give
 * line:column (bytes, 1-based) and the field's path ("model[1].kindd: unknown
 * field"). The table is then built by pt_job_spec_build, so JSON and binary
 * share one builder. Limits: strings up to JOB_MAX_STRING bytes.
 */
#include <assert.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fileio.h"
#include "job.h"
#include "json.h"
#include "model_wire.h"

#define JOB_MAX_STRING 4096
#define JOB_MAX_FILE   ((size_t)64 << 20)
#define JOB_PATH_LEN   256

typedef enum jtype {
	JT_I64,
	JT_I32,
	JT_U64,
	JT_F32,
	JT_BOOL, /* the last scalar but JT_ENUM (parse_value reads null by this) */
	JT_STR,
	JT_ENUM,    /* stored as an int-sized C enum */
	JT_TABLE,   /* nested table read into the same base */
	JT_LAYERS,  /* [Layer] into spec->layers */
	JT_BOUNDS,  /* [int] placement.boundaries (inner edges) */
	JT_WORKERS, /* [string] placement.workers */
} jtype;

typedef struct jenum {
	const char *type;
	const char *const *names; /* value i is names[i] */
	int count;
} jenum;

struct jtable;

typedef struct jfield {
	const char *name;
	uint8_t type;
	size_t off;
	const jenum *en;
	const struct jtable *sub;
} jfield;

typedef struct jtable {
	const char *name;
	const jfield *fields;
	int n;
} jtable;

/* C enums are stored through int pointers. */
static_assert(sizeof(pt_layer_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_optim_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_sched_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_data_format) == sizeof(int), "enum size");
static_assert(sizeof(pt_loss_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_pipe_mode) == sizeof(int), "enum size");

static const char *const layer_kinds[] = {
    "Linear",  "ReLU",      "GELU",      "Tanh",      "Sigmoid",
    "Dropout", "LayerNorm", "Embedding", "Attention", "TransformerBlock",
    "Softmax"};
static_assert(sizeof(layer_kinds) / sizeof(layer_kinds[0]) == PT_LAYER_KIND_COUNT,
              "LayerKind names match pt_layer_kind");
static const char *const optim_kinds[] = {"SGD", "AdamW"};
static const char *const sched_kinds[] = {"Constant", "WarmupCosine"};
static const char *const data_formats[] = {"Npy", "Tokens16", "Tokens32", "Auto"};
static const char *const loss_kinds[] = {"CrossEntropy", "MSE"};
static const char *const modes[] = {"Sync", "SemiAsync", "Async"};

#define JENUM(type_, names_)                                                                       \
	{                                                                                          \
		type_, names_, (int)(sizeof(names_) / sizeof(names_[0]))                           \
	}
static const jenum layer_kind_enum = JENUM("LayerKind", layer_kinds);
static const jenum optim_enum = JENUM("OptimizerKind", optim_kinds);
static const jenum sched_enum = JENUM("ScheduleKind", sched_kinds);
static const jenum format_enum = JENUM("DataFormat", data_formats);
static const jenum loss_enum = JENUM("LossKind", loss_kinds);
static const jenum mode_enum = JENUM("Mode", modes);

#define F(name_, type_, st_, member_)                                                              \
	{                                                                                          \
		name_, type_, offsetof(st_, member_), NULL, NULL                                   \
	}
#define FE(name_, st_, member_, en_)                                                               \
	{                                                                                          \
		name_, JT_ENUM, offsetof(st_, member_), &(en_), NULL                               \
	}
#define FT(name_, sub_)                                                                            \
	{                                                                                          \
		name_, JT_TABLE, 0, NULL, &(sub_)                                                  \
	}
#define JTABLE(name_, fields_)                                                                     \
	{                                                                                          \
		name_, fields_, (int)(sizeof(fields_) / sizeof(fields_[0]))                        \
	}

static const jfield layer_fields[] = {
    FE("kind", pt_layer_spec, kind, layer_kind_enum),
    F("in_features", JT_I64, pt_layer_spec, in_features),
    F("out_features", JT_I64, pt_layer_spec, out_features),
    F("bias", JT_BOOL, pt_layer_spec, bias),
    F("dim", JT_I64, pt_layer_spec, dim),
    F("n_head", JT_I32, pt_layer_spec, n_head),
    F("vocab", JT_I64, pt_layer_spec, vocab),
    F("max_seq", JT_I64, pt_layer_spec, max_seq),
    F("mlp_hidden", JT_I64, pt_layer_spec, mlp_hidden),
    F("p", JT_F32, pt_layer_spec, p),
    F("eps", JT_F32, pt_layer_spec, eps),
};
static const jtable layer_table = JTABLE("Layer", layer_fields);

static const jfield optimizer_fields[] = {
    FE("kind", pt_job_spec, optim.kind, optim_enum),
    F("lr", JT_F32, pt_job_spec, optim.lr),
    F("beta1", JT_F32, pt_job_spec, optim.beta1),
    F("beta2", JT_F32, pt_job_spec, optim.beta2),
    F("eps", JT_F32, pt_job_spec, optim.eps),
    F("weight_decay", JT_F32, pt_job_spec, optim.weight_decay),
    F("momentum", JT_F32, pt_job_spec, optim.momentum),
    F("dampening", JT_F32, pt_job_spec, optim.dampening),
    F("nesterov", JT_BOOL, pt_job_spec, optim.nesterov),
    F("clip_norm", JT_F32, pt_job_spec, optim.clip_norm),
    FE("schedule", pt_job_spec, optim.schedule.kind, sched_enum),
    F("warmup_steps", JT_I64, pt_job_spec, optim.schedule.warmup_steps),
    F("total_steps", JT_I64, pt_job_spec, optim.schedule.total_steps),
    F("min_lr", JT_F32, pt_job_spec, optim.schedule.min_lr),
};
static const jtable optimizer_table = JTABLE("Optimizer", optimizer_fields);

static const jfield data_fields[] = {
    FE("format", pt_job_spec, data.format, format_enum),
    F("features", JT_STR, pt_job_spec, data.features),
    F("labels", JT_STR, pt_job_spec, data.labels),
    F("tokens", JT_STR, pt_job_spec, data.tokens),
    F("seq_len", JT_I64, pt_job_spec, data.seq_len),
    F("vocab", JT_I64, pt_job_spec, data.vocab),
    F("held_out", JT_F32, pt_job_spec, data.held_out),
    F("shuffle", JT_BOOL, pt_job_spec, data.shuffle),
    F("val_tokens", JT_STR, pt_job_spec, data.val_tokens),
};
static const jtable data_table = JTABLE("Data", data_fields);

static const jfield placement_fields[] = {
    F("stages", JT_I32, pt_job_spec, stages),
    F("boundaries", JT_BOUNDS, pt_job_spec, boundaries),
    F("workers", JT_WORKERS, pt_job_spec, workers),
    F("threads_per_stage", JT_I32, pt_job_spec, threads_per_stage),
    F("worker_timeout_ms", JT_I32, pt_job_spec, worker_timeout_ms),
};
static const jtable placement_table = JTABLE("Placement", placement_fields);

static const jfield checkpoint_fields[] = {
    F("every_steps", JT_I64, pt_job_spec, checkpoint_every),
    F("keep", JT_I32, pt_job_spec, checkpoint_keep),
    F("resume", JT_BOOL, pt_job_spec, resume),
};
static const jtable checkpoint_table = JTABLE("CheckpointPolicy", checkpoint_fields);

static const jfield job_fields[] = {
    F("name", JT_STR, pt_job_spec, name),
    F("model", JT_LAYERS, pt_job_spec, layers),
    FT("data", data_table),
    FE("loss", pt_job_spec, loss, loss_enum),
    F("ignore_index", JT_I64, pt_job_spec, ignore_index),
    FT("optimizer", optimizer_table),
    F("batch_size", JT_I64, pt_job_spec, batch_size),
    F("microbatches", JT_I32, pt_job_spec, microbatches),
    F("steps", JT_I64, pt_job_spec, steps),
    FE("mode", pt_job_spec, mode, mode_enum),
    FT("placement", placement_table),
    FT("checkpoint", checkpoint_table),
    F("device", JT_STR, pt_job_spec, device),
    F("seed", JT_U64, pt_job_spec, seed),
    F("eval_every", JT_I64, pt_job_spec, eval_every),
    F("compress", JT_BOOL, pt_job_spec, compress),
    F("recompute", JT_BOOL, pt_job_spec, recompute),
    F("weight_stashing", JT_BOOL, pt_job_spec, weight_stashing),
    F("use_graphs", JT_BOOL, pt_job_spec, use_graphs),
    F("max_restarts", JT_I32, pt_job_spec, max_restarts),
    F("init_from", JT_STR, pt_job_spec, init_from),
    F("priority", JT_I32, pt_job_spec, priority),
    F("schedule", JT_STR, pt_job_spec, schedule),
    F("virtual_stages", JT_I32, pt_job_spec, virtual_stages),
    F("precision", JT_STR, pt_job_spec, precision),
};
static const jtable job_table = JTABLE("JobSpec", job_fields);

/* A field given twice is an error: each table's fields fit one seen-mask. */
static_assert(sizeof(layer_fields) / sizeof(layer_fields[0]) <= 64, "field mask");
static_assert(sizeof(optimizer_fields) / sizeof(optimizer_fields[0]) <= 64, "field mask");
static_assert(sizeof(data_fields) / sizeof(data_fields[0]) <= 64, "field mask");
static_assert(sizeof(placement_fields) / sizeof(placement_fields[0]) <= 64, "field mask");
static_assert(sizeof(checkpoint_fields) / sizeof(checkpoint_fields[0]) <= 64, "field mask");
static_assert(sizeof(job_fields) / sizeof(job_fields[0]) <= 64, "field mask");

/* Tokens past the one-character ones ({ } [ ] : ,). */
enum { TK_EOF = 0, TK_STR = 256, TK_IDENT, TK_INT, TK_FLOAT };

typedef struct jlex {
	const char *p, *end;
	const char *name;    /* the file, for messages; NULL: "line L, column C" */
	int line;            /* of p, 1-based */
	const char *bol;     /* where p's line begins */
	bool newline;        /* a line began since the last token (or there was none) */
	int tok;             /* the current token */
	const char *ts, *te; /* its text as written (a string's with its quotes) */
	int tline, tcol;     /* where it begins (column in bytes, 1-based) */
	char *s;             /* TK_STR: the decoded bytes, NUL after n of them */
	size_t n, cap;
} jlex;

/* The reader's state: the lexer, the spec, the boundaries as written (inner
 * edges, turned into the struct's stages + 1 edges once stages and the model
 * are known) and where they and the JobSpec's closing brace were. */
typedef struct jctx {
	jlex l;
	pt_job_spec *spec;
	int *bounds;
	size_t n_bounds;
	size_t cap_layers, cap_bounds, cap_workers; /* allocated elements */
	int bline, bcol, eline, ecol;
	bool have_bounds, have_model, have_data, have_optim;
} jctx;

static pt_err fail_at(const jlex *l, int line, int col, pt_err e, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* fail_at records "NAME:L:C: message" (or "line L, column C: message"). */
static pt_err fail_at(const jlex *l, int line, int col, pt_err e, const char *fmt, ...)
{
	char msg[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (l->name != NULL)
		return pt_set_error(e, "%s:%d:%d: %s", l->name, line, col, msg);
	return pt_set_error(e, "line %d, column %d: %s", line, col, msg);
}

/* The error at the current token. */
#define FAIL(l, e, ...) fail_at((l), (l)->tline, (l)->tcol, (e), __VA_ARGS__)

static bool is_digit(int c)
{
	return c >= '0' && c <= '9';
}

static bool is_xdigit(int c)
{
	return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static bool is_ident_start(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident(int c)
{
	return is_ident_start(c) || is_digit(c);
}

static int xval(int c)
{
	return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* scan_number returns the end of flatc's number at p: a sign, then decimal
 * digits with an optional fraction and exponent, or 0x and hex digits with an
 * optional fraction and a p exponent (which a fraction makes mandatory). It
 * sets *kind to TK_INT or TK_FLOAT; NULL when malformed ("0x", "1e", "1..2"). */
static const char *scan_number(const char *p, const char *end, int *kind)
{
	bool hex = false, frac = false, exp = false;
	size_t digits = 0;

	if (p < end && (*p == '+' || *p == '-'))
		p++;
	if (end - p >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
		hex = true;
		p += 2;
	}
	for (; p < end && (hex ? is_xdigit(*p) : is_digit(*p)); p++)
		digits++;
	if (p < end && *p == '.') {
		frac = true;
		for (p++; p < end && (hex ? is_xdigit(*p) : is_digit(*p)); p++)
			digits++;
	}
	if (digits == 0)
		return NULL;
	if (p < end && (hex ? (*p == 'p' || *p == 'P') : (*p == 'e' || *p == 'E'))) {
		size_t e = 0;
		exp = true;
		if (++p < end && (*p == '+' || *p == '-'))
			p++;
		for (; p < end && is_digit(*p); p++)
			e++;
		if (e == 0)
			return NULL;
	}
	if ((p < end && *p == '.') || (hex && frac && !exp))
		return NULL;
	*kind = frac || exp ? TK_FLOAT : TK_INT;
	return p;
}

static pt_err put_byte(jlex *l, int c)
{
	if (l->n + 2 > l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		char *s = realloc(l->s, cap);
		if (s == NULL)
			return pt_set_error(PT_ERR_NOMEM, "JobSpec JSON: string of %zu bytes",
			                    l->n);
		l->s = s;
		l->cap = cap;
	}
	l->s[l->n++] = (char)c;
	l->s[l->n] = '\0';
	return PT_OK;
}

static pt_err put_utf8(jlex *l, uint32_t cp)
{
	if (cp < 0x80)
		return put_byte(l, (int)cp);
	if (cp < 0x800) {
		PT_TRY(put_byte(l, 0xc0 | (int)(cp >> 6)));
	} else {
		if (cp < 0x10000) {
			PT_TRY(put_byte(l, 0xe0 | (int)(cp >> 12)));
		} else {
			PT_TRY(put_byte(l, 0xf0 | (int)(cp >> 18)));
			PT_TRY(put_byte(l, 0x80 | (int)((cp >> 12) & 0x3f)));
		}
		PT_TRY(put_byte(l, 0x80 | (int)((cp >> 6) & 0x3f)));
	}
	return put_byte(l, 0x80 | (int)(cp & 0x3f));
}

/* utf8_valid: well-formed UTF-8 (no overlong forms, surrogates or code
 * points past U+10FFFF), as flatc requires of strings. */
static bool utf8_valid(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned c = s[i];
		size_t k = c < 0x80                ? 0
		           : c >= 0xc2 && c < 0xe0 ? 1
		           : c >= 0xe0 && c < 0xf0 ? 2
		           : c >= 0xf0 && c < 0xf5 ? 3
		                                   : 9;
		uint32_t cp;
		if (k == 9 || n - i <= k)
			return k == 0;
		cp = c & (0x3fu >> k);
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + j] & 0x3fu);
		}
		if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) ||
		    (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
			return false;
		i += k + 1;
	}
	return true;
}

/* hex4 reads four hex digits at p (before end) into *v. */
static bool hex4(const char *p, const char *end, uint32_t *v)
{
	*v = 0;
	if (end - p < 4)
		return false;
	for (int i = 0; i < 4; i++) {
		if (!is_xdigit(p[i]))
			return false;
		*v = *v << 4 | (uint32_t)xval(p[i]);
	}
	return true;
}

/* lex_string reads a string in double or single quotes at p: the escapes
 * \" \' \\ \/ \b \f \n \r \t \xHH and \uXXXX (surrogates paired); no raw
 * control characters; the bytes must be UTF-8. */
static pt_err lex_string(jlex *l)
{
	char q = *l->p++;
	l->n = 0;
	PT_TRY(put_byte(l, 0)); /* a NUL-terminated buffer even when empty */
	l->n = 0;
	for (;;) {
		const char *e = l->p;
		int col = (int)(e - l->bol) + 1;
		uint32_t cp, lo;

		if (e >= l->end)
			return FAIL(l, PT_ERR_FORMAT, "the string is not closed");
		if (*e == q) {
			l->p++;
			break;
		}
		if ((unsigned char)*e < 0x20)
			return fail_at(l, l->line, col, PT_ERR_FORMAT,
			               "a control character (0x%02x) in a string; write it as an "
			               "escape such as \\n",
			               (unsigned char)*e);
		if (*e != '\\') {
			PT_TRY(put_byte(l, (unsigned char)*e));
			l->p++;
			continue;
		}
		if (e + 1 >= l->end)
			return FAIL(l, PT_ERR_FORMAT, "the string is not closed");
		switch (e[1]) {
		case 'b':
			PT_TRY(put_byte(l, '\b'));
			break;
		case 'f':
			PT_TRY(put_byte(l, '\f'));
			break;
		case 'n':
			PT_TRY(put_byte(l, '\n'));
			break;
		case 'r':
			PT_TRY(put_byte(l, '\r'));
			break;
		case 't':
			PT_TRY(put_byte(l, '\t'));
			break;
		case '"':
		case '\'':
		case '\\':
		case '/':
			PT_TRY(put_byte(l, e[1]));
			break;
		case 'x':
			if (l->end - e < 4 || !is_xdigit(e[2]) || !is_xdigit(e[3]))
				return fail_at(l, l->line, col, PT_ERR_FORMAT,
				               "\\x needs two hex digits");
			PT_TRY(put_byte(l, xval(e[2]) << 4 | xval(e[3])));
			l->p += 2;
			break;
		case 'u':
			if (!hex4(e + 2, l->end, &cp))
				return fail_at(l, l->line, col, PT_ERR_FORMAT,
				               "\\u needs four hex digits");
			l->p += 4;
			if (cp >= 0xdc00 && cp < 0xe000)
				return fail_at(l, l->line, col, PT_ERR_FORMAT,
				               "\\u%04X: a low surrogate without a high one", cp);
			if (cp >= 0xd800 && cp < 0xdc00) {
				if (l->end - e < 12 || e[6] != '\\' || e[7] != 'u' ||
				    !hex4(e + 8, l->end, &lo) || lo < 0xdc00 || lo >= 0xe000)
					return fail_at(
					    l, l->line, col, PT_ERR_FORMAT,
					    "\\u%04X: a high surrogate without a low one", cp);
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				l->p += 6;
			}
			PT_TRY(put_utf8(l, cp));
			break;
		default:
			return fail_at(l, l->line, col, PT_ERR_FORMAT,
			               "unknown escape \\%c in a string", e[1]);
		}
		l->p += 2;
	}
	if (!utf8_valid((const unsigned char *)l->s, l->n))
		return FAIL(l, PT_ERR_FORMAT, "the string is not UTF-8");
	l->tok = TK_STR;
	return PT_OK;
}

/* next reads the next token, skipping whitespace (space, tab, CR, LF) and
 * comments. flatc reads a /// comment as documentation, which must begin its
 * line; so do we. */
static pt_err next(jlex *l)
{
	const char *p;
	int c;

	for (;;) {
		if (l->p >= l->end)
			break;
		c = *l->p;
		if (c == '\n') {
			l->line++;
			l->bol = ++l->p;
			l->newline = true;
		} else if (c == ' ' || c == '\t' || c == '\r') {
			l->p++;
		} else if (c == '/' && l->end - l->p >= 2 && l->p[1] == '/') {
			if (l->end - l->p >= 3 && l->p[2] == '/' && !l->newline)
				return fail_at(
				    l, l->line, (int)(l->p - l->bol) + 1, PT_ERR_FORMAT,
				    "a /// comment must begin its line (flatc reads it as "
				    "documentation)");
			while (l->p < l->end && *l->p != '\n')
				l->p++;
		} else if (c == '/' && l->end - l->p >= 2 && l->p[1] == '*') {
			int line = l->line, col = (int)(l->p - l->bol) + 1;
			for (p = l->p + 2; !(l->end - p >= 2 && p[0] == '*' && p[1] == '/'); p++) {
				if (p >= l->end)
					return fail_at(l, line, col, PT_ERR_FORMAT,
					               "the /* comment is not closed");
				if (*p == '\n') {
					l->line++;
					l->bol = p + 1;
				}
			}
			l->p = p + 2;
		} else {
			break;
		}
	}
	l->ts = l->p;
	l->tline = l->line;
	l->tcol = (int)(l->p - l->bol) + 1;
	l->newline = false;
	if (l->p >= l->end) {
		l->tok = TK_EOF;
		l->te = l->p;
		return PT_OK;
	}
	c = (unsigned char)*l->p;
	p = l->p;
	if (c != 0 && strchr("{}[]:,", c) != NULL) {
		l->tok = c;
		l->p++;
	} else if (c == '"' || c == '\'') {
		PT_TRY(lex_string(l));
	} else if (is_ident_start(c) ||
	           ((c == '+' || c == '-') && l->end - p >= 2 && is_ident_start(p[1]))) {
		/* Names; a signed one is "-inf" or "+nan" for a float. */
		for (p++; p < l->end && is_ident(*p); p++)
			;
		l->tok = TK_IDENT;
		l->p = p;
	} else if (is_digit(c) || c == '+' || c == '-' || c == '.') {
		const char *e = scan_number(p, l->end, &l->tok);
		if (e == NULL) {
			for (e = p + 1; e < l->end && (is_ident(*e) || *e == '.'); e++)
				;
			return FAIL(l, PT_ERR_FORMAT, "invalid number %.*s", (int)(e - p), p);
		}
		l->p = e;
	} else if (c >= 0x20 && c < 0x7f) {
		return FAIL(l, PT_ERR_FORMAT, "unexpected character '%c'", c);
	} else {
		return FAIL(l, PT_ERR_FORMAT, "unexpected byte 0x%02x", c);
	}
	l->te = l->p;
	return PT_OK;
}

static bool tok_is(const jlex *l, const char *word)
{
	size_t n = strlen(word);
	return l->tok == TK_IDENT && (size_t)(l->te - l->ts) == n && memcmp(l->ts, word, n) == 0;
}

/* what names the current token for a message: "the number 1.5", "an object". */
static const char *what(const jlex *l, char *buf, size_t cap)
{
	int n = (int)(l->te - l->ts);
	const char *more = n > 40 ? "..." : "";

	n = n > 40 ? 40 : n;
	switch (l->tok) {
	case TK_EOF:
		return "the end of the text";
	case '{':
		return "an object";
	case '[':
		return "an array";
	case TK_STR:
		snprintf(buf, cap, "the string %.*s%s", n, l->ts, more);
		return buf;
	case TK_INT:
	case TK_FLOAT:
		snprintf(buf, cap, "the number %.*s%s", n, l->ts, more);
		return buf;
	case TK_IDENT:
		if (tok_is(l, "null") || tok_is(l, "true") || tok_is(l, "false"))
			snprintf(buf, cap, "%.*s", n, l->ts);
		else
			snprintf(buf, cap, "the name %.*s%s", n, l->ts, more);
		return buf;
	default:
		snprintf(buf, cap, "'%c'", l->tok);
		return buf;
	}
}

static pt_err type_error(const jlex *l, const char *path, const char *expected)
{
	char b[64];
	return FAIL(l, PT_ERR_FORMAT, "%s: expected %s, got %s", path, expected,
	            what(l, b, sizeof(b)));
}

/* A scalar as written: a bare number or name, or one inside quotes. */
typedef struct jscalar {
	int kind; /* TK_INT, TK_FLOAT, TK_IDENT; 0: a string that holds none */
	const char *s;
	size_t n;
} jscalar;

/* scalar_of reads the current token as a scalar. flatc reads "0.1", "0x10"
 * and "Sync" in quotes as the bare token; spaces may surround a number in
 * quotes but not a name, and other characters must be printable ASCII. */
static void scalar_of(const jlex *l, jscalar *sc)
{
	const char *a = l->s, *b = l->s != NULL ? l->s + l->n : NULL; /* NULL + 0 is UB */

	sc->kind = 0;
	sc->s = l->ts;
	sc->n = (size_t)(l->te - l->ts);
	if (l->tok == TK_INT || l->tok == TK_FLOAT || l->tok == TK_IDENT) {
		sc->kind = l->tok;
		return;
	}
	if (l->tok != TK_STR)
		return;
	for (const char *p = a; p < b; p++)
		if (*p < 0x20 || *p > 0x7e)
			return;
	while (a < b && *a == ' ')
		a++;
	while (b > a && b[-1] == ' ')
		b--;
	if (a == b)
		return;
	if (is_ident_start(*a) ||
	    (b - a >= 2 && (*a == '+' || *a == '-') && is_ident_start(a[1]))) {
		const char *p = a + 1;
		while (p < b && is_ident(*p))
			p++;
		if (p != b || a != l->s || b != l->s + l->n)
			return;
		sc->kind = TK_IDENT;
	} else {
		int kind;
		if (scan_number(a, b, &kind) != b)
			return;
		sc->kind = kind;
	}
	sc->s = a;
	sc->n = (size_t)(b - a);
}

/* json_integer reads the current token as an integer in [lo, hi]: decimal or
 * 0x hex, signed, bare or in quotes. *out holds its bits (hi may pass
 * INT64_MAX: ulong). */
static pt_err json_integer(const jlex *l, const char *path, int64_t lo, uint64_t hi,
                           const char *type, uint64_t *out)
{
	jscalar sc;
	const char *p, *end;
	uint64_t mag = 0;
	bool neg = false, over = false;
	int base = 10;

	scalar_of(l, &sc);
	if (sc.kind != TK_INT)
		return type_error(l, path, "an integer");
	p = sc.s;
	end = sc.s + sc.n;
	if (*p == '+' || *p == '-')
		neg = *p++ == '-';
	if (end - p > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
		base = 16;
		p += 2;
	}
	for (; p < end; p++) {
		unsigned d = (unsigned)xval(*p);
		if (mag > (UINT64_MAX - d) / (unsigned)base)
			over = true;
		mag = mag * (unsigned)base + d;
	}
	if (!over && neg && mag != 0)
		over = lo >= 0 || mag - 1 > (uint64_t)INT64_MAX || -(int64_t)(mag - 1) - 1 < lo;
	else if (!over && !neg)
		over = mag > hi;
	if (over)
		return FAIL(l, PT_ERR_RANGE, "%s: %.*s is out of range for %s", path, (int)sc.n,
		            sc.s, type);
	*out = neg && mag != 0 ? (uint64_t)(-(int64_t)(mag - 1) - 1) : mag;
	return PT_OK;
}

/* json_float reads a float: a number (no hex integer: flatc wants a p
 * exponent there), inf, infinity or nan with any case and sign, bare or in
 * quotes. Like flatc it rounds with strtof, so 1e39 is inf. */
static pt_err json_float(const jlex *l, const char *path, float *out)
{
	jscalar sc;
	char buf[128], *s = buf, *end;
	bool ok = true;

	scalar_of(l, &sc);
	if (sc.kind == TK_IDENT) {
		const char *w = sc.s + (*sc.s == '+' || *sc.s == '-');
		size_t n = sc.n - (size_t)(w - sc.s);
		ok = (n == 3 && (strncasecmp(w, "inf", 3) == 0 || strncasecmp(w, "nan", 3) == 0)) ||
		     (n == 8 && strncasecmp(w, "infinity", 8) == 0);
	}
	if (sc.kind == 0 || !ok)
		return type_error(l, path, "a number");
	if (sc.kind == TK_INT &&
	    (memchr(sc.s, 'x', sc.n) != NULL || memchr(sc.s, 'X', sc.n) != NULL))
		return FAIL(l, PT_ERR_FORMAT,
		            "%s: %.*s: a hexadecimal float needs a p exponent (0x10p0)", path,
		            (int)sc.n, sc.s);
	if (sc.n >= sizeof(buf) && (s = malloc(sc.n + 1)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", path);
	memcpy(s, sc.s, sc.n);
	s[sc.n] = '\0';
	*out = strtof(s, &end);
	ok = end == s + sc.n;
	if (s != buf)
		free(s);
	if (!ok)
		return type_error(l, path, "a number");
	return PT_OK;
}

/* json_bool reads true or false, or an integer 0 to 255 (not 0: true). */
static pt_err json_bool(const jlex *l, const char *path, bool *out)
{
	jscalar sc;
	uint64_t v;

	scalar_of(l, &sc);
	if (sc.kind == TK_IDENT && sc.n == 4 && memcmp(sc.s, "true", 4) == 0) {
		*out = true;
		return PT_OK;
	}
	if (sc.kind == TK_IDENT && sc.n == 5 && memcmp(sc.s, "false", 5) == 0) {
		*out = false;
		return PT_OK;
	}
	if (sc.kind != TK_INT)
		return type_error(l, path, "a boolean");
	PT_TRY(json_integer(l, path, 0, UINT8_MAX, "bool (0 to 255)", &v));
	*out = v != 0;
	return PT_OK;
}

/* json_enum reads a declared name, bare or in quotes, or its value. */
static pt_err json_enum(const jlex *l, const char *path, const jenum *en, int *out)
{
	jscalar sc;
	uint64_t v;
	char names[256];
	size_t o = 0;

	scalar_of(l, &sc);
	if (sc.kind == TK_INT) {
		PT_TRY(json_integer(l, path, 0, UINT8_MAX, "ubyte", &v));
		if (v >= (uint64_t)en->count)
			return FAIL(l, PT_ERR_RANGE, "%s: %d is out of range for %s", path, (int)v,
			            en->type);
		*out = (int)v;
		return PT_OK;
	}
	if (sc.kind != TK_IDENT && l->tok != TK_STR)
		return type_error(l, path, "an enum name or value");
	if (sc.kind == 0) { /* a string that holds no name, e.g. "Sync Async" */
		sc.s = l->s;
		sc.n = l->n;
	}
	for (int k = 0; k < en->count; k++)
		if (strlen(en->names[k]) == sc.n && memcmp(en->names[k], sc.s, sc.n) == 0) {
			*out = k;
			return PT_OK;
		}
	for (int k = 0; k < en->count && o < sizeof(names); k++)
		o += (size_t)snprintf(names + o, sizeof(names) - o, "%s%s", k ? ", " : "",
		                      en->names[k]);
	return FAIL(l, PT_ERR_FORMAT, "%s: unknown %s \"%.*s\" (one of %s)", path, en->type,
	            (int)(sc.n > 40 ? 40 : sc.n), sc.s, names);
}

static pt_err json_cstring(const jlex *l, const char *path, char **out)
{
	if (l->tok != TK_STR)
		return type_error(l, path, "a string");
	if (l->n > JOB_MAX_STRING)
		return FAIL(l, PT_ERR_RANGE, "%s: %zu bytes (at most %d)", path, l->n,
		            JOB_MAX_STRING);
	if (memchr(l->s, 0, l->n) != NULL)
		return FAIL(l, PT_ERR_FORMAT, "%s: contains a NUL character", path);
	if ((*out = strdup(l->s)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", path);
	return PT_OK;
}

/* join appends ".name" (or "name" at the root) to path[plen]; returns the new length. */
static size_t join(char *path, size_t plen, const char *name, size_t nlen)
{
	int w =
	    snprintf(path + plen, JOB_PATH_LEN - plen, "%s%.*s", plen ? "." : "", (int)nlen, name);
	size_t n = plen + (w > 0 ? (size_t)w : 0);
	return n < JOB_PATH_LEN ? n : JOB_PATH_LEN - 1;
}

static size_t join_index(char *path, size_t plen, size_t i)
{
	int w = snprintf(path + plen, JOB_PATH_LEN - plen, "[%zu]", i);
	size_t n = plen + (w > 0 ? (size_t)w : 0);
	return n < JOB_PATH_LEN ? n : JOB_PATH_LEN - 1;
}

/* grow makes room for element n of size elem in *arr, of *cap allocated. */
static pt_err grow(void **arr, size_t n, size_t *cap, size_t elem, const char *path)
{
	void *p;
	if (n < *cap)
		return PT_OK;
	if ((p = realloc(*arr, (*cap ? 2 * *cap : 8) * elem)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", path);
	*arr = p;
	*cap = *cap ? 2 * *cap : 8;
	return PT_OK;
}

static pt_err parse_table(jctx *c, const jtable *t, void *base, char *path, size_t plen);

/* parse_array reads [a, b, ...] (a trailing comma allowed, "[,]" not) with
 * element(c, path, n, i) for each, which reads it and the token after it. */
static pt_err parse_array(jctx *c, const char *expected, char *path, size_t plen,
                          pt_err (*element)(jctx *, char *, size_t, size_t))
{
	jlex *l = &c->l;
	char b[64];

	if (l->tok != '[')
		return type_error(l, path, expected);
	PT_TRY(next(l));
	for (size_t i = 0; l->tok != ']'; i++) {
		size_t n = join_index(path, plen, i);
		PT_TRY(element(c, path, n, i));
		if (l->tok != ',' && l->tok != ']')
			return FAIL(l, PT_ERR_FORMAT, "%s: expected ',' or ']' after it, got %s",
			            path, what(l, b, sizeof(b)));
		path[plen] = 0;
		if (l->tok == ',')
			PT_TRY(next(l));
	}
	return next(l);
}

static pt_err layer_element(jctx *c, char *path, size_t plen, size_t i)
{
	pt_job_spec *s = c->spec;

	if (i >= PT_MAX_LAYERS)
		return FAIL(&c->l, PT_ERR_RANGE, "%s: more than %d layers", path, PT_MAX_LAYERS);
	if (c->l.tok != '{')
		return type_error(&c->l, path, "a Layer object");
	PT_TRY(grow((void **)&s->layers, i, &c->cap_layers, sizeof(*s->layers), path));
	memset(&s->layers[i], 0, sizeof(s->layers[i]));
	s->layers[i].bias = true; /* the schema's default */
	s->n_layers = (int)i + 1;
	return parse_table(c, &layer_table, &s->layers[i], path, plen);
}

static pt_err bound_element(jctx *c, char *path, size_t plen, size_t i)
{
	uint64_t v;

	(void)plen;
	if (i >= PT_MAX_STAGES)
		return FAIL(&c->l, PT_ERR_RANGE, "%s: more than %d entries", path, PT_MAX_STAGES);
	PT_TRY(json_integer(&c->l, path, INT32_MIN, INT32_MAX, "int", &v));
	PT_TRY(grow((void **)&c->bounds, i, &c->cap_bounds, sizeof(int), path));
	c->bounds[i] = (int)(int64_t)v;
	c->n_bounds = i + 1;
	return next(&c->l);
}

static pt_err worker_element(jctx *c, char *path, size_t plen, size_t i)
{
	pt_job_spec *s = c->spec;

	(void)plen;
	if (i >= PT_MAX_STAGES)
		return FAIL(&c->l, PT_ERR_RANGE, "%s: more than %d URLs", path, PT_MAX_STAGES);
	if (c->l.tok != TK_STR)
		return type_error(&c->l, path, "a string");
	PT_TRY(grow((void **)&s->workers, i, &c->cap_workers, sizeof(char *), path));
	PT_TRY(json_cstring(&c->l, path, &s->workers[i]));
	s->n_workers = (int)i + 1;
	return next(&c->l);
}

/* parse_value reads field f's value and the token after it; *absent when
 * it was null (flatc allows that for strings, tables and vectors only). */
static pt_err parse_value(jctx *c, const jfield *f, void *base, char *path, size_t plen,
                          bool *absent)
{
	jlex *l = &c->l;
	char *at = (char *)base + f->off;
	uint64_t v;

	*absent = false;
	if (tok_is(l, "null")) {
		if (f->type <= JT_BOOL || f->type == JT_ENUM) /* the scalars */
			return FAIL(
			    l, PT_ERR_FORMAT,
			    "%s: null is not a value of a scalar field (leave the field out "
			    "for its default)",
			    path);
		*absent = true;
		return next(l);
	}
	switch ((jtype)f->type) {
	case JT_I64: {
		int64_t x;
		PT_TRY(json_integer(l, path, INT64_MIN, INT64_MAX, "long", &v));
		x = (int64_t)v;
		memcpy(at, &x, sizeof(x));
		break;
	}
	case JT_I32: {
		int32_t x;
		PT_TRY(json_integer(l, path, INT32_MIN, INT32_MAX, "int", &v));
		x = (int32_t)(int64_t)v;
		memcpy(at, &x, sizeof(x));
		break;
	}
	case JT_U64:
		PT_TRY(json_integer(l, path, 0, UINT64_MAX, "ulong", &v));
		memcpy(at, &v, sizeof(v));
		break;
	case JT_F32: {
		float x = 0;
		PT_TRY(json_float(l, path, &x));
		memcpy(at, &x, sizeof(x));
		break;
	}
	case JT_BOOL: {
		bool x = false;
		PT_TRY(json_bool(l, path, &x));
		memcpy(at, &x, sizeof(x));
		break;
	}
	case JT_STR: {
		char *x = NULL;
		PT_TRY(json_cstring(l, path, &x));
		memcpy(at, &x, sizeof(x));
		break;
	}
	case JT_ENUM: {
		int x = 0;
		PT_TRY(json_enum(l, path, f->en, &x));
		memcpy(at, &x, sizeof(x));
		break;
	}
	case JT_TABLE:
		if (l->tok != '{')
			return type_error(l, path, "an object");
		return parse_table(c, f->sub, base, path, plen);
	case JT_LAYERS:
		if (l->tok == '[' && c->spec->layers == NULL &&
		    (c->spec->layers = calloc(1, sizeof(*c->spec->layers))) == NULL)
			return pt_set_error(PT_ERR_NOMEM, "%s", path);
		return parse_array(c, "an array of Layer objects", path, plen, layer_element);
	case JT_BOUNDS:
		c->have_bounds = true;
		c->bline = l->tline;
		c->bcol = l->tcol;
		return parse_array(c, "an array of integers", path, plen, bound_element);
	case JT_WORKERS:
		return parse_array(c, "an array of strings", path, plen, worker_element);
	default:
		return FAIL(l, PT_ERR_STATE, "%s: bad field description", path);
	}
	return next(l);
}

/* parse_table reads {name: value, ...} at the current '{' (names bare or in
 * quotes; a trailing comma allowed, "{,}" not) and the token after it. */
static pt_err parse_table(jctx *c, const jtable *t, void *base, char *path, size_t plen)
{
	jlex *l = &c->l;
	uint64_t seen = 0;
	char b[64];

	PT_TRY(next(l));
	while (l->tok != '}') {
		const jfield *f = NULL;
		const char *key = l->ts;
		size_t klen = (size_t)(l->te - l->ts), n;
		bool absent;
		int j;

		if (l->tok == TK_STR) {
			key = l->s;
			klen = l->n;
		} else if (l->tok != TK_IDENT || !is_ident_start(*l->ts)) {
			return FAIL(l, PT_ERR_FORMAT, "%s: expected a field name or '}', got %s",
			            plen ? path : t->name, what(l, b, sizeof(b)));
		}
		n = join(path, plen, key, klen);
		for (j = 0; j < t->n && f == NULL; j++)
			if (strlen(t->fields[j].name) == klen &&
			    memcmp(t->fields[j].name, key, klen) == 0)
				f = &t->fields[j];
		if (f == NULL)
			return FAIL(l, PT_ERR_FORMAT, "%s: unknown field (of %s)", path, t->name);
		if (seen & (1ull << (j - 1)))
			return FAIL(l, PT_ERR_FORMAT, "%s: field set more than once", path);
		seen |= 1ull << (j - 1);
		PT_TRY(next(l));
		if (l->tok != ':')
			return FAIL(l, PT_ERR_FORMAT, "%s: expected ':' after the name, got %s",
			            path, what(l, b, sizeof(b)));
		PT_TRY(next(l));
		PT_TRY(parse_value(c, f, base, path, n, &absent));
		if (t == &job_table && !absent) {
			c->have_model |= f->type == JT_LAYERS;
			c->have_data |= f->sub == &data_table;
			c->have_optim |= f->sub == &optimizer_table;
		}
		if (l->tok != ',' && l->tok != '}')
			return FAIL(l, PT_ERR_FORMAT, "%s: expected ',' or '}' after it, got %s",
			            path, what(l, b, sizeof(b)));
		path[plen] = 0;
		if (l->tok == ',')
			PT_TRY(next(l));
	}
	c->eline = l->tline;
	c->ecol = l->tcol;
	return next(l);
}

/* finish_bounds turns the written inner edges into stages + 1 edges. */
static pt_err finish_bounds(jctx *c)
{
	pt_job_spec *s = c->spec;
	if (!c->have_bounds)
		return PT_OK;
	if (s->stages < 1 || s->stages > PT_MAX_STAGES)
		return fail_at(&c->l, c->bline, c->bcol, PT_ERR_RANGE,
		               "placement.stages: %d (1 to %d)", s->stages, PT_MAX_STAGES);
	if (c->n_bounds != (size_t)s->stages - 1)
		return fail_at(&c->l, c->bline, c->bcol, PT_ERR_INVALID,
		               "placement.boundaries: %zu entries for %d stages (expected %d)",
		               c->n_bounds, s->stages, s->stages - 1);
	if ((s->boundaries = malloc(sizeof(int) * ((size_t)s->stages + 1))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "placement.boundaries");
	s->boundaries[0] = 0;
	if (c->n_bounds)
		memcpy(s->boundaries + 1, c->bounds, sizeof(int) * c->n_bounds);
	s->boundaries[s->stages] = s->n_layers;
	return PT_OK;
}

/* parse_text reads a JobSpec's JSON text; name (or NULL) starts messages. */
static pt_err parse_text(const char *text, size_t len, const char *name, pt_job_spec *out)
{
	char path[JOB_PATH_LEN] = "";
	jctx c = {.spec = out};
	jlex *l = &c.l;
	const char *nul = memchr(text, 0, len);
	pt_err rv;

	pt_job_spec_defaults(out);
	l->p = l->bol = text;
	l->end = text + len;
	l->name = name;
	l->line = 1;
	l->newline = true;
	if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
		l->p += 3; /* a UTF-8 byte order mark */
	if (nul != NULL) {
		const char *bol = text;
		int line = 1;
		for (const char *p = text; p < nul; p++)
			if (*p == '\n') {
				line++;
				bol = p + 1;
			}
		rv = fail_at(l, line, (int)(nul - bol) + 1, PT_ERR_FORMAT,
		             "a NUL byte: not JSON text");
	} else if ((rv = next(l)) != PT_OK) {
	} else if (l->tok == TK_EOF) {
		rv = FAIL(l, PT_ERR_FORMAT, "JobSpec: no JSON object (the text is empty)");
	} else if (l->tok != '{') {
		rv = type_error(l, "JobSpec", "an object");
	} else if ((rv = parse_table(&c, &job_table, out, path, 0)) != PT_OK) {
	} else if (l->tok != TK_EOF) {
		char b[64];
		rv =
		    FAIL(l, PT_ERR_FORMAT, "expected the end of the text after the JobSpec, got %s",
		         what(l, b, sizeof(b)));
	} else if (!c.have_model) {
		rv = fail_at(l, c.eline, c.ecol, PT_ERR_FORMAT, "model: required field missing");
	} else if (!c.have_data) {
		rv = fail_at(l, c.eline, c.ecol, PT_ERR_FORMAT, "data: required field missing");
	} else if (!c.have_optim) {
		rv =
		    fail_at(l, c.eline, c.ecol, PT_ERR_FORMAT, "optimizer: required field missing");
	} else {
		rv = finish_bounds(&c);
	}
	free(c.bounds);
	free(l->s);
	if (rv != PT_OK)
		pt_job_spec_fini(out);
	return rv;
}

pt_err pt_job_spec_parse_json(const char *text, size_t len, pt_job_spec *out)
{
	return parse_text(text, len, NULL, out);
}

static pt_err from_json(pt_fb_builder *b, const char *text, size_t len, const char *name,
                        pt_fb_ref *out)
{
	pt_job_spec s;
	pt_err rv;
	*out = 0;
	PT_TRY(parse_text(text, len, name, &s));
	rv = pt_job_spec_build(b, &s, out);
	pt_job_spec_fini(&s);
	return rv;
}

pt_err pt_job_spec_from_json(pt_fb_builder *b, const char *text, size_t len, pt_fb_ref *out)
{
	return from_json(b, text, len, NULL, out);
}

/* looks_like_json: the text starts (after a byte order mark and whitespace)
 * with '{' or a comment and holds no NUL byte, so a JSON error is the one to
 * report rather than the binary verifier's. */
static bool looks_like_json(const char *text, size_t n)
{
	size_t i = n >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
	while (i < n && strchr(" \t\r\n", text[i]) != NULL && text[i] != '\0')
		i++;
	return i < n && (text[i] == '{' || text[i] == '/') && memchr(text, 0, n) == NULL;
}

pt_err pt_job_spec_load_file(const char *path, void **buf, size_t *len)
{
	pt_fb_builder b;
	const uint8_t *data;
	void *text = NULL, *copy;
	size_t n = 0, size;
	pt_fb_ref root;
	char binary_err[512];
	pt_err rv;

	*buf = NULL;
	*len = 0;
	PT_TRY(pt_file_read(path, JOB_MAX_FILE, &text, &n));
	/* A verifiable JobSpec is binary (pt_file_read's buffer is malloc'd,
	 * so aligned); JSON text never verifies (its first bytes make an
	 * offset far past the end). */
	if (pt_fb_verify(text, n, &pt_fb_job_job_spec_desc, NULL, NULL) == PT_OK) {
		*buf = text;
		*len = n;
		return PT_OK;
	}
	snprintf(binary_err, sizeof(binary_err), "%s", pt_last_error());
	if ((rv = pt_fb_builder_init(&b, 1024)) != PT_OK) {
		free(text);
		return pt_set_error(rv, "%s: %s", path, pt_last_error());
	}
	/* Every message starts with the path (the CLI prints it as is). */
	if (!looks_like_json(text, n))
		rv = pt_set_error(PT_ERR_FORMAT,
		                  "%s: not a job file: not JSON text (that starts with '{') and "
		                  "not a JobSpec binary either: %s",
		                  path, binary_err);
	else if ((rv = from_json(&b, text, n, path, &root)) == PT_OK &&
	         (rv = pt_fb_finish(&b, root, NULL, &data, &size)) != PT_OK)
		rv = pt_set_error(rv, "%s: %s", path, pt_last_error());
	free(text);
	if (rv == PT_OK) {
		if ((copy = malloc(size)) == NULL) {
			rv = pt_set_error(PT_ERR_NOMEM, "%s: job buffer", path);
		} else {
			memcpy(copy, data, size);
			*buf = copy;
			*len = size;
		}
	}
	pt_fb_builder_fini(&b);
	return rv;
}
