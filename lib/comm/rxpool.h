/* rxpool.h - the bytes of received tensors, lent from a small pool.
 *
 * A stage receives tensors of the same few sizes over and over. A fresh
 * large allocation costs a page fault per 4 KiB page on first touch (glibc
 * maps and unmaps buffers of 32 MiB and more on every use, and trims freed
 * heap tops), which capped the nng communicator at half a plain socket's
 * speed. Storages made here of PT_RX_POOL_MIN bytes or more give their
 * buffer back to the pool when released (pt_storage.give_back), and the next
 * tensor of that size takes it. The pool keeps at most PT_RX_POOL_SLOTS
 * buffers and PT_RX_POOL_MAX bytes, the oldest evicted first; it lives on
 * after its owner closes it until every lent buffer is back (then freed).
 *
 * Thread-safety: pt_rx_pool_storage and the storages' release may run on any
 * thread concurrently; create and close belong to the owner.
 */
#ifndef PT_RXPOOL_H
#define PT_RXPOOL_H

#include <stddef.h>

#include "tensor.h"

#define PT_RX_POOL_MIN   ((size_t)64 << 10)
#define PT_RX_POOL_SLOTS 8
#define PT_RX_POOL_MAX   ((size_t)256 << 20)
#define PT_RX_HUGE_BYTES ((size_t)32 << 20) /* from here on: huge pages asked for */

typedef struct pt_rx_pool pt_rx_pool;

/* pt_rx_pool_create makes an empty pool owned by the caller. */
pt_err pt_rx_pool_create(pt_rx_pool **out);

/* pt_rx_pool_close gives up the owner's reference: the kept buffers are freed
 * at once, lent ones when they come back. NULL is fine. */
void pt_rx_pool_close(pt_rx_pool *p);

/* pt_rx_pool_storage makes a CPU storage of n bytes (contents undefined), one
 * reference owned by the caller: from p when it keeps a buffer of exactly n
 * bytes, else newly allocated (p NULL: always, and never given back). */
pt_err pt_rx_pool_storage(pt_rx_pool *p, size_t n, pt_storage **out);

/* pt_rx_alloc returns n bytes (at least 1) that free() releases: 64-aligned,
 * from PT_RX_HUGE_BYTES on 2 MiB-aligned with transparent huge pages asked
 * for (fewer faults on the first write; THP is "madvise" on Debian). NULL
 * when out of memory. */
void *pt_rx_alloc(size_t n);

#endif
