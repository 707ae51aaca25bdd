/* fuzz_json.c - lib/data/json.c: the strict JSON parser and the writer.
 *
 * Whatever parses must write, and the written text must parse to an equal
 * document and write to the same bytes again (a fixed point). */
#include <math.h>

#include "fuzz_common.h"
#include "json.h"

static int json_equal(const pt_json *a, const pt_json *b)
{
	if (a->type != b->type)
		return 0;
	switch (a->type) {
	case PT_JSON_NULL:
		return 1;
	case PT_JSON_BOOL:
		return a->boolean == b->boolean;
	case PT_JSON_NUMBER:
		/* -0 is written as 0 and reads back as an integer 0: compare values. */
		return a->is_int == b->is_int && (!a->is_int || a->i == b->i) && a->d == b->d;
	case PT_JSON_STRING:
		return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
	case PT_JSON_ARRAY:
		if (a->len != b->len)
			return 0;
		for (size_t i = 0; i < a->len; i++)
			if (!json_equal(&a->items[i], &b->items[i]))
				return 0;
		return 1;
	case PT_JSON_OBJECT:
		if (a->len != b->len)
			return 0;
		for (size_t i = 0; i < a->len; i++)
			if (a->members[i].key_len != b->members[i].key_len ||
			    memcmp(a->members[i].key, b->members[i].key, a->members[i].key_len) !=
			        0 ||
			    !json_equal(&a->members[i].value, &b->members[i].value))
				return 0;
		return 1;
	}
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pt_json doc, again;
	pt_buf w1, w2;
	pt_json_limits lim = {.max_depth = 32, .max_values = 100000};

	if (pt_json_parse(&doc, (const char *)data, size, &lim) != PT_OK) {
		FUZZ_CHECK(doc.type == PT_JSON_NULL);
		pt_json_fini(&doc);
		return 0;
	}
	/* Lookups the readers use. */
	if (doc.type == PT_JSON_OBJECT && doc.len > 0) {
		const pt_json_member *m = &doc.members[doc.len - 1];
		if (m->key_len == strlen(m->key))
			FUZZ_CHECK(pt_json_get(&doc, m->key) != NULL);
	}
	if (doc.type == PT_JSON_ARRAY) {
		int64_t x;
		FUZZ_CHECK(pt_json_at(&doc, doc.len) == NULL);
		if (doc.len > 0)
			(void)pt_json_int(pt_json_at(&doc, 0), &x);
	}
	pt_buf_init(&w1);
	pt_buf_init(&w2);
	FUZZ_CHECK(pt_json_write(&w1, &doc) == PT_OK);
	FUZZ_CHECK(pt_json_parse(&again, w1.data, w1.len, &lim) == PT_OK);
	FUZZ_CHECK(json_equal(&doc, &again));
	FUZZ_CHECK(pt_json_write(&w2, &again) == PT_OK);
	FUZZ_CHECK(w1.len == w2.len && memcmp(w1.data, w2.data, w1.len) == 0);
	pt_buf_fini(&w1);
	pt_buf_fini(&w2);
	pt_json_fini(&again);
	pt_json_fini(&doc);
	return 0;
}
