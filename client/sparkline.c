/* sparkline.c - see sparkline.h. */
#include "sparkline.h"

#include <math.h>
#include <string.h>

/* U+2581..U+2588 in UTF-8: E2 96 81..88. */
static const char *const levels[8] = {"\xe2\x96\x81", "\xe2\x96\x82", "\xe2\x96\x83",
                                      "\xe2\x96\x84", "\xe2\x96\x85", "\xe2\x96\x86",
                                      "\xe2\x96\x87", "\xe2\x96\x88"};

int sparkline_render(char *out, size_t cap, const double *v, size_t n, int width)
{
	size_t first, len = 0;
	double lo = INFINITY, hi = -INFINITY;
	int cols = 0;

	if (out == NULL || cap == 0)
		return 0;
	out[0] = '\0';
	if (v == NULL || width <= 0 || n == 0)
		return 0;
	first = n > (size_t)width ? n - (size_t)width : 0;
	for (size_t i = first; i < n; i++)
		if (isfinite(v[i])) {
			lo = v[i] < lo ? v[i] : lo;
			hi = v[i] > hi ? v[i] : hi;
		}
	for (size_t i = first; i < n; i++) {
		const char *g = " ";
		size_t gl;
		if (isfinite(v[i])) {
			int k = hi > lo ? (int)((v[i] - lo) / (hi - lo) * 7 + 0.5) : 3;
			g = levels[k < 0 ? 0 : k > 7 ? 7 : k];
		}
		gl = strlen(g);
		if (len + gl + 1 > cap)
			break;
		memcpy(out + len, g, gl);
		len += gl;
		out[len] = '\0';
		cols++;
	}
	return cols;
}
