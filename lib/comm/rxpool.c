/* rxpool.c - received tensors' bytes, lent from a small pool (rxpool.h). */
#include "rxpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE_BYTES ((size_t)2 << 20)

struct pt_rx_pool {
	atomic_int refs; /* the owner's and one per lent buffer */
	pthread_mutex_t mu;
	bool closed; /* the owner is gone: buffers coming back are freed */
	int n;
	size_t bytes;
	void *buf[PT_RX_POOL_SLOTS]; /* oldest first */
	size_t size[PT_RX_POOL_SLOTS];
};

void *pt_rx_alloc(size_t n)
{
	size_t align = n >= PT_RX_HUGE_BYTES ? HUGE_PAGE_BYTES : 64;
	size_t rounded = (n + align - 1) & ~(align - 1);
	void *p;

	if (rounded < n)
		return NULL;
	p = aligned_alloc(align, rounded ? rounded : align);
	if (p && align == HUGE_PAGE_BYTES)
		madvise(p, rounded, MADV_HUGEPAGE);
	return p;
}

pt_err pt_rx_pool_create(pt_rx_pool **out)
{
	if ((*out = calloc(1, sizeof(**out))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "receive pool");
	atomic_init(&(*out)->refs, 1);
	pthread_mutex_init(&(*out)->mu, NULL);
	return PT_OK;
}

static void unref(pt_rx_pool *p)
{
	if (atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	for (int i = 0; i < p->n; i++)
		free(p->buf[i]);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

void pt_rx_pool_close(pt_rx_pool *p)
{
	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->closed = true;
	for (int i = 0; i < p->n; i++)
		free(p->buf[i]);
	p->n = 0;
	p->bytes = 0;
	pthread_mutex_unlock(&p->mu);
	unref(p);
}

/* take removes entry i (lock held). */
static void take(pt_rx_pool *p, int i)
{
	p->bytes -= p->size[i];
	p->n--;
	memmove(p->buf + i, p->buf + i + 1, (size_t)(p->n - i) * sizeof(p->buf[0]));
	memmove(p->size + i, p->size + i + 1, (size_t)(p->n - i) * sizeof(p->size[0]));
}

/* give_back is a lent storage's give_back: any thread. */
static void give_back(void *ctx, void *data, size_t nbytes)
{
	pt_rx_pool *p = ctx;

	pthread_mutex_lock(&p->mu);
	if (!p->closed && nbytes <= PT_RX_POOL_MAX) {
		while (p->n > 0 &&
		       (p->n == PT_RX_POOL_SLOTS || p->bytes + nbytes > PT_RX_POOL_MAX)) {
			free(p->buf[0]);
			take(p, 0);
		}
		p->buf[p->n] = data;
		p->size[p->n++] = nbytes;
		p->bytes += nbytes;
		data = NULL;
	}
	pthread_mutex_unlock(&p->mu);
	free(data);
	unref(p);
}

pt_err pt_rx_pool_storage(pt_rx_pool *p, size_t n, pt_storage **out)
{
	bool lend = p != NULL && n >= PT_RX_POOL_MIN;
	void *data = NULL;
	pt_err rv;

	if (lend) {
		pthread_mutex_lock(&p->mu);
		for (int i = p->n - 1; i >= 0 && data == NULL; i--)
			if (p->size[i] == n) {
				data = p->buf[i];
				take(p, i);
			}
		pthread_mutex_unlock(&p->mu);
	}
	if (data == NULL && (data = pt_rx_alloc(n)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "received tensor of %zu bytes", n);
	if ((rv = pt_storage_wrap(out, data, n, PT_CPU)) != PT_OK) {
		free(data);
		return rv;
	}
	(*out)->owns_data = true;
	if (lend) {
		atomic_fetch_add(&p->refs, 1);
		(*out)->give_back = give_back;
		(*out)->give_back_ctx = p;
	}
	return PT_OK;
}
