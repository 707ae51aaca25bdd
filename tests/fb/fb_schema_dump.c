/* fb_schema_dump.c - prints the compiled verifier descriptors (fb_schema.h's
 * pt_fb_schema_tables) as JSON, for schema_check.py to compare with the
 * schemas' reflection. A nested table or union member is named by its index
 * in pt_fb_schema_tables, or -1 when it is not a generated descriptor. */
#include <stdio.h>

#include "fb_schema.h"

static int table_index(const pt_fb_table_desc *d)
{
	for (int i = 0; i < PT_FB_SCHEMA_NTABLES; i++)
		if (pt_fb_schema_tables[i].desc == d)
			return i;
	return -1;
}

int main(void)
{
	printf("[\n");
	for (int i = 0; i < PT_FB_SCHEMA_NTABLES; i++) {
		const pt_fb_schema_table *t = &pt_fb_schema_tables[i];
		printf(
		    " {\"schema\": \"%s\", \"name\": \"%s\", \"desc_name\": \"%s\", \"fields\": [",
		    t->schema, t->name, t->desc->name);
		for (int j = 0; j < t->desc->nfields; j++) {
			const pt_fb_field_desc *f = &t->desc->fields[j];
			printf(
			    "%s\n  {\"name\": \"%s\", \"id\": %u, \"kind\": %u, \"required\": %s, "
			    "\"size\": %u, \"align\": %u, \"table\": %d, \"members\": ",
			    j ? "," : "", f->name, f->id, f->kind, f->required ? "true" : "false",
			    f->size, f->align, f->table ? table_index(f->table) : -1);
			if (f->kind == PT_FB_UNION && f->un) {
				printf("[");
				for (int k = 0; k < f->un->count; k++)
					printf("%s%d", k ? ", " : "",
					       f->un->members[k] ? table_index(f->un->members[k])
					                         : -1);
				printf("]}");
			} else {
				printf("null}");
			}
		}
		printf("]}%s\n", i + 1 < PT_FB_SCHEMA_NTABLES ? "," : "");
	}
	printf("]\n");
	return 0;
}
