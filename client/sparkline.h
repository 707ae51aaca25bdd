/* sparkline.h - a series (the loss) as one line of Unicode block characters,
 * for `pipeclient watch` on a terminal. Pure: no I/O, no state, thread-safe.
 */
#ifndef PIPECLIENT_SPARKLINE_H
#define PIPECLIENT_SPARKLINE_H

#include <stddef.h>

/* Bytes of one glyph in UTF-8 (U+2581..U+2588 and the space for gaps take
 * at most this many). */
#define SPARKLINE_GLYPH_BYTES 3

/* sparkline_render writes the last `width` values of v[0..n) (all of them
 * when n < width) into out as UTF-8, one column each: the least finite value
 * shown is U+2581 (lower one eighth block), the greatest U+2588 (full
 * block), values between on the nearest of the eight levels. NaN and
 * infinities are a space (a gap); when every finite value shown is the same,
 * each is U+2584 (lower half block). Writes whole glyphs only and stops when
 * out (cap bytes) is full; out is always NUL-terminated when cap > 0.
 * Returns the number of columns written (0 for width <= 0, n == 0 or v NULL). */
int sparkline_render(char *out, size_t cap, const double *v, size_t n, int width);

#endif
