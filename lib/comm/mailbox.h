/* mailbox.h - a rank's receive queues, shared by every communicator.
 *
 * One FIFO per (source, channel) plus errors, all stamped with an arrival
 * number, so a receive can ask for one source and channel, or for "any
 * source" / "any channel" and get the earliest matching arrival. Errors found
 * while receiving (a corrupt header, a sequence gap) are queued in arrival
 * order too and handed to the first receive they match: an error naming a
 * source matches receives from that source (any channel) and from
 * PT_ANY_RANK; an error of unknown origin (source -1) matches every receive.
 *
 * A source can be marked lost (its peer disappeared): receives from it still
 * get what is queued, then fail with PT_ERR_CLOSED instead of waiting. Close
 * wakes every waiter with PT_ERR_CLOSED and refuses later pushes and pops.
 *
 * Thread-safety: every function may be called from any thread concurrently,
 * except destroy. No function blocks except pt_mailbox_pop (up to its timeout);
 * the internal lock is held only for queue manipulation, so pushing from an
 * nng callback is fine.
 */
#ifndef PT_MAILBOX_H
#define PT_MAILBOX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "comm.h"

typedef struct pt_mailbox pt_mailbox;

/* pt_mailbox_create makes the queues of rank `owner` for sources [0, world). */
pt_err pt_mailbox_create(pt_mailbox **out, int world, int owner);

/* pt_mailbox_destroy frees the mailbox and every message still queued.
 * NULL-safe; nobody may use mb concurrently. */
void pt_mailbox_destroy(pt_mailbox *mb);

/* pt_mailbox_push queues *m under (m->meta.source, m->meta.channel), which the
 * caller has validated. On success the mailbox owns what m held and *m is
 * zeroed; on error (PT_ERR_CLOSED after close, PT_ERR_NOMEM) m is untouched
 * and still the caller's. Never blocks. */
pt_err pt_mailbox_push(pt_mailbox *mb, pt_msg *m);

/* pt_mailbox_push_error queues an error for source (-1: unknown origin) that
 * the matching receive returns as code with text as its pt_last_error(). */
pt_err pt_mailbox_push_error(pt_mailbox *mb, int source, pt_err code, const char *text);

/* pt_mailbox_pop waits up to timeout_ms (< 0: forever; 0: do not wait) for the
 * earliest arrival matching src (or PT_ANY_RANK) and ch (or PT_CH_ANY) and
 * moves it into *out (the caller's; *out is zeroed on error). Returns
 * PT_ERR_TIMEOUT, PT_ERR_CLOSED (mailbox closed; or the source, or for
 * PT_ANY_RANK every source but the owner, lost with nothing left to match),
 * or a queued error's code. */
pt_err pt_mailbox_pop(pt_mailbox *mb, int src, pt_channel ch, int timeout_ms, pt_msg *out);

/* pt_mailbox_close wakes every waiter with PT_ERR_CLOSED; later pushes and
 * pops fail with PT_ERR_CLOSED. Queued messages stay until destroy. */
void pt_mailbox_close(pt_mailbox *mb);

/* pt_mailbox_is_closed tells whether pt_mailbox_close was called. */
bool pt_mailbox_is_closed(pt_mailbox *mb);

/* pt_mailbox_mark_lost marks source lost (sticky) and wakes its waiters. */
void pt_mailbox_mark_lost(pt_mailbox *mb, int source);

/* pt_mailbox_is_lost tells whether source was marked lost. */
bool pt_mailbox_is_lost(pt_mailbox *mb, int source);

/* pt_mailbox_pending returns the number of queued messages and errors. */
size_t pt_mailbox_pending(pt_mailbox *mb);

/* pt_mailbox_drain frees every queued message and error now (memory back
 * early, e.g. when the owner is destroyed before the mailbox). */
void pt_mailbox_drain(pt_mailbox *mb);

/* pt_comm_counters are the counters of pt_comm_stats, kept by every
 * communicator (atomic: any thread adds). Communicators that never compress
 * add the same to bytes_sent and bytes_raw_sent. */
typedef struct pt_comm_counters {
	atomic_uint_fast64_t msgs_sent, msgs_recv, bytes_sent, bytes_recv, bytes_raw_sent, errors,
	    timeouts, reconnects;
} pt_comm_counters;

/* pt_comm_counters_get returns a snapshot of k. */
pt_comm_stats pt_comm_counters_get(const pt_comm_counters *k);

/* pt_now_ms returns the CLOCK_MONOTONIC time in milliseconds (the clock of
 * every communicator timeout). */
long long pt_now_ms(void);

#endif
