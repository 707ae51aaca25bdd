/* comm.c - what every communicator shares: pt_msg helpers, argument checks in
 * front of the implementations' ops, and seed 001's forward/backward names.
 */
#include "comm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

pt_channel pt_msg_channel(pt_msg_kind kind)
{
	switch (kind) {
	case PT_MSG_FORWARD:
		return PT_CH_FORWARD;
	case PT_MSG_BACKWARD:
		return PT_CH_BACKWARD;
	default:
		return PT_CH_CONTROL;
	}
}

void pt_msg_fini(pt_msg *m)
{
	if (m == NULL)
		return;
	pt_tensor_fini(&m->tensor);
	free(m->blob);
	memset(m, 0, sizeof(*m));
}

pt_err pt_msg_set_blob(pt_msg *m, const void *data, size_t len)
{
	void *b;

	if (m == NULL || (data == NULL && len > 0))
		return pt_set_error(PT_ERR_INVALID, "pt_msg_set_blob: NULL argument");
	b = malloc(len ? len : 1);
	if (b == NULL)
		return pt_set_error(PT_ERR_NOMEM, "message blob of %zu bytes", len);
	if (len)
		memcpy(b, data, len);
	free(m->blob);
	m->blob = b;
	m->blob_len = len;
	return PT_OK;
}

static pt_err check_rank(const pt_comm *c, int r, bool any_ok, const char *what)
{
	if ((any_ok && r == PT_ANY_RANK) || (r >= 0 && r < c->world))
		return PT_OK;
	return pt_set_error(PT_ERR_RANGE, "%s rank %d outside [0, %d) of rank %d's communicator",
	                    what, r, c->world, c->rank);
}

pt_err pt_comm_send(pt_comm *c, int dst, pt_msg *m)
{
	if (c == NULL || m == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_comm_send: NULL argument");
	PT_TRY(check_rank(c, dst, false, "destination"));
	if ((unsigned)m->meta.kind >= PT_MSG_KIND_COUNT)
		return pt_set_error(PT_ERR_INVALID, "message kind %d", (int)m->meta.kind);
	if (m->blob == NULL && m->blob_len > 0)
		return pt_set_error(PT_ERR_INVALID, "blob of %zu bytes without data", m->blob_len);
	if (m->has_tensor) {
		if (m->tensor.storage == NULL)
			return pt_set_error(PT_ERR_INVALID, "message tensor has no storage");
		if (m->tensor.storage->device.kind != PT_DEV_CPU && !c->ops->device_tensors)
			return pt_set_error(PT_ERR_UNSUPPORTED,
			                    "send of a device tensor (copy it to the CPU first)");
		PT_TRY(pt_tensor_sync(&m->tensor));
	}
	m->meta.source = c->rank;
	m->meta.channel = pt_msg_channel(m->meta.kind);
	return c->ops->send(c, dst, m);
}

pt_err pt_comm_recv(pt_comm *c, int src, pt_channel ch, int timeout_ms, pt_msg *out)
{
	if (c == NULL || out == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_comm_recv: NULL argument");
	memset(out, 0, sizeof(*out));
	PT_TRY(check_rank(c, src, true, "source"));
	if (!pt_channel_valid_recv(ch))
		return pt_set_error(PT_ERR_RANGE, "channel %d", (int)ch);
	return c->ops->recv(c, src, ch, timeout_ms < 0 ? c->timeout_ms : timeout_ms, out);
}

/* Set while this thread is in pt_comm_recv_slice. */
static _Thread_local bool in_slice;

bool pt_comm_timeout_counts(int timeout_ms)
{
	return timeout_ms != 0 && !in_slice;
}

pt_err pt_comm_recv_slice(pt_comm *c, int src, pt_channel ch, int slice_ms, pt_msg *out)
{
	bool was = in_slice;
	pt_err rv;
	in_slice = true;
	rv = pt_comm_recv(c, src, ch, slice_ms, out);
	in_slice = was;
	return rv;
}

pt_err pt_comm_barrier(pt_comm *c, int timeout_ms)
{
	if (c == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_comm_barrier: NULL communicator");
	return c->ops->barrier(c, timeout_ms < 0 ? c->timeout_ms : timeout_ms);
}

void pt_comm_close(pt_comm *c)
{
	if (c)
		c->ops->close(c);
}

void pt_comm_destroy(pt_comm *c)
{
	if (c)
		c->ops->destroy(c);
}

pt_comm_stats pt_comm_get_stats(const pt_comm *c)
{
	pt_comm_stats none = {0};
	return c && c->ops->stats ? c->ops->stats(c) : none;
}

static pt_err send_tensor(pt_comm *c, int dst, const pt_tensor *t, pt_msg_kind kind, int64_t step,
                          int32_t mb)
{
	pt_msg m = {0};
	pt_err rv;

	if (t == NULL || t->storage == NULL)
		return pt_set_error(PT_ERR_INVALID, "send of a NULL tensor");
	m.meta.kind = kind;
	m.meta.step = step;
	m.meta.microbatch = mb;
	m.has_tensor = true;
	pt_tensor_view(&m.tensor, t);
	rv = pt_comm_send(c, dst, &m);
	pt_msg_fini(&m);
	return rv;
}

pt_err pt_comm_send_forward(pt_comm *c, int dst, const pt_tensor *t, int64_t step, int32_t mb)
{
	return send_tensor(c, dst, t, PT_MSG_FORWARD, step, mb);
}

pt_err pt_comm_recv_forward(pt_comm *c, int src, int timeout_ms, pt_msg *out)
{
	return pt_comm_recv(c, src, PT_CH_FORWARD, timeout_ms, out);
}

pt_err pt_comm_send_backward(pt_comm *c, int dst, const pt_tensor *t, int64_t step, int32_t mb)
{
	return send_tensor(c, dst, t, PT_MSG_BACKWARD, step, mb);
}

pt_err pt_comm_recv_backward(pt_comm *c, int src, int timeout_ms, pt_msg *out)
{
	return pt_comm_recv(c, src, PT_CH_BACKWARD, timeout_ms, out);
}

pt_err pt_comm_key_generate(uint8_t key[PT_COMM_KEY_BYTES])
{
	size_t got = 0;

	while (got < PT_COMM_KEY_BYTES) {
		ssize_t n = getrandom(key + got, PT_COMM_KEY_BYTES - got, 0);
		if (n <= 0)
			return pt_set_error(PT_ERR_IO,
			                    "getrandom: no random bytes for a session key");
		got += (size_t)n;
	}
	return PT_OK;
}

static int hex_digit(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

pt_err pt_comm_key_parse(const char *hex, uint8_t key[PT_COMM_KEY_BYTES])
{
	if (hex == NULL || strlen(hex) != 2 * PT_COMM_KEY_BYTES)
		return pt_set_error(PT_ERR_INVALID, "session key: %d hex digits expected",
		                    2 * PT_COMM_KEY_BYTES);
	for (int i = 0; i < PT_COMM_KEY_BYTES; i++) {
		int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return pt_set_error(PT_ERR_INVALID, "session key: not a hex digit at %d",
			                    hi < 0 ? 2 * i : 2 * i + 1);
		key[i] = (uint8_t)(hi << 4 | lo);
	}
	return PT_OK;
}

void pt_comm_key_format(const uint8_t key[PT_COMM_KEY_BYTES], char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < PT_COMM_KEY_BYTES; i++) {
		out[2 * i] = digits[key[i] >> 4];
		out[2 * i + 1] = digits[key[i] & 15];
	}
	out[2 * PT_COMM_KEY_BYTES] = '\0';
}
