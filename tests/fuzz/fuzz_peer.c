/*
 * fuzz_peer: moverd's peer receive path (moverd/peer_rx.c, flows.c) against
 * arbitrary frames from two connections at once, interleaved with what the
 * receiving host does meanwhile, with real deposit rings (files in a state
 * directory on /dev/shm, mapped as moverd maps them).
 *
 * The input is a script, one byte an op (connection = bit 0, op = the rest)
 * followed by the op's arguments:
 *   connect, hello, open, close (PeerFlowClose), a DATA/ACK/raw header,
 *   a piece of the body in flight (written where moverd pointed the
 *   receive: the consumer ring, or dropped), raw stream bytes cut
 *   anywhere (a header in two pieces, a body and the next frames in one:
 *   every op reaches moverd through peer_rx_stream, as TCP's staged
 *   receive delivers), disconnect (the receive in
 *   flight completes only at a later "receive ends" op, as a cancelled
 *   io_uring recv does), a local `flow destroy`, a consumer storing any
 *   head in its ring or catching up, a duty cycle (acks, sends), and the
 *   completion of the send in flight.
 * ASan finds a ring written after it was unmapped, a flow used after it
 * was freed, a reference never dropped (a leak at the end of the input).
 * ASan does not watch a file mapping's edges, so every shared file mapping
 * moverd makes here sits between two PROT_NONE guard pages (the mmap and
 * munmap wrappers below): a copy past a ring's end faults.
 * After each input every peer and flow is gone: nothing may be left.
 *
 * The transport is a stand-in that records what the protocol asked for;
 * everything above it is the daemon's own code.
 */
#include "peer_impl.h"
#include "control.h"
#include "mover.h"
#include "log.h"

#include "flowmover.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONNS 2
#define NAMES 3
#define ZOMBIES 16

enum op {
	OP_CONNECT, OP_HELLO, OP_OPEN, OP_CLOSE, OP_DATA, OP_BODY, OP_ACK,
	OP_RAW, OP_DISCONNECT, OP_RECV_ENDS, OP_DESTROY, OP_HEAD, OP_CATCH_UP,
	OP_DUTY, OP_SENT, OP_STREAM, OP_COUNT
};

struct input {
	const uint8_t *p;
	size_t n;
};

static struct peer_mgr mgr;
static struct flow_table table;
static struct ctl_server ctl;

/* as moverd's main.c does: a destroyed flow's attachments are forgotten */
static void forget_attachments(void *arg, struct flow *f)
{
	ctl_server_forget_flow(arg, f);
}
static struct peer *conn[CONNS];
static struct peer *zombie[ZOMBIES]; /* failed, a receive still in flight */
static unsigned n_zombies;

static uint64_t take(struct input *in, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes && in->n; i++, in->p++, in->n--)
		v |= (uint64_t)*in->p << (8 * i);
	return v;
}

/* ---- guard pages around shared file mappings ------------------------------ */

/*
 * Linked with -Wl,--wrap=mmap,--wrap=munmap: moverd's and libflowshm's
 * calls come here.  A shared mapping of a file at an address of the
 * kernel's choosing (a ring, a doorbell page) is placed inside a PROT_NONE
 * reservation one page larger on each side; its munmap releases the whole
 * reservation.  Every other call goes straight through.
 */
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd,
		  off_t off);
int __real_munmap(void *addr, size_t len);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd,
		  off_t off);
int __wrap_munmap(void *addr, size_t len);

#define GUARDED 64

static struct guarded {
	uint8_t *inner;
	size_t len;
} guarded[GUARDED];

static size_t page_round(size_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return (len + page - 1) / page * page;
}

static struct guarded *guarded_slot(const void *inner)
{
	for (int i = 0; i < GUARDED; i++)
		if (guarded[i].inner == inner)
			return &guarded[i];
	return NULL;
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd,
		  off_t off)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), span;
	struct guarded *g = guarded_slot(NULL);
	uint8_t *base;
	void *in;

	if (addr || fd < 0 || !(flags & MAP_SHARED) || !len || !g)
		return __real_mmap(addr, len, prot, flags, fd, off);
	span = page_round(len) + 2 * page;
	base = __real_mmap(NULL, span, PROT_NONE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return MAP_FAILED;
	in = __real_mmap(base + page, len, prot, flags | MAP_FIXED, fd, off);
	if (in == MAP_FAILED) {
		__real_munmap(base, span);
		return MAP_FAILED;
	}
	*g = (struct guarded){ in, len };
	return in;
}

int __wrap_munmap(void *addr, size_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct guarded *g = addr ? guarded_slot(addr) : NULL;

	if (!g || g->len != len)
		return __real_munmap(addr, len);
	*g = (struct guarded){ NULL, 0 };
	return __real_munmap((uint8_t *)addr - page, page_round(len) + 2 * page);
}

/* ---- the stand-in transport ---------------------------------------------- */

static void fake_send(struct peer *p)
{
	p->wr_op.busy = true; /* completes at OP_SENT or at disconnect */
}

static void fake_noop(struct peer *p)
{
	(void)p;
}

static void fake_shutdown(struct peer *p)
{
	/* a send in flight ends with the connection; the receive in flight
	 * ends later (OP_RECV_ENDS), as a cancelled recv does */
	p->wr_op.busy = false;
}

static const struct transport fake = {
	.name = "fake",
	.send = fake_send,
	.recv = fake_noop,
	.shutdown = fake_shutdown,
	.close = fake_noop,
};

/* ---- connections --------------------------------------------------------- */

/* A connection the protocol failed is no longer ours to drive. */
static void settle(void)
{
	for (int i = 0; i < CONNS; i++) {
		struct peer *p = conn[i];

		if (!p || p->state == PEER_UP)
			continue;
		conn[i] = NULL;
		if (p->rd_op.busy && n_zombies < ZOMBIES)
			zombie[n_zombies++] = p;
		else
			p->rd_op.busy = false;
	}
}

/*
 * Everything reaches moverd as a byte stream would (peer_rx_stream, as
 * tcp.c's staged receive hands it over): a header, a piece of a body, a
 * control message whole with its header, or raw bytes that may end
 * anywhere, a header cut in two among them.
 */
static void deliver_header(struct peer *p, enum wire_type type, uint32_t id,
			   uint32_t len, uint64_t pos, uint64_t aux)
{
	uint8_t h[WIRE_HDR];

	if (p->in_body)
		return; /* a byte stream: the body comes first */
	wire_put(h, type, id, len, pos, aux);
	peer_rx_stream(p, h, sizeof(h));
}

/* Up to n body bytes from the input, no further than the body's end. */
static void deliver_body(struct peer *p, struct input *in, size_t n)
{
	uint8_t b[8192];
	size_t rest = p->hdr.len - p->body_have;

	if (!p->in_body)
		return;
	if (n > rest)
		n = rest;
	if (n > sizeof(b))
		n = sizeof(b);
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)take(in, 1);
	peer_rx_stream(p, b, n);
}

/* The next n input bytes as they are. */
static void deliver_raw(struct peer *p, struct input *in, size_t n)
{
	if (n > in->n)
		n = in->n;
	peer_rx_stream(p, in->p, n);
	in->p += n;
	in->n -= n;
}

/* A control message: its header and body in one piece of the stream. */
static void deliver_msg(struct peer *p, Flowmover__PeerMsg *msg)
{
	size_t len = protobuf_c_message_get_packed_size(&msg->base);
	uint8_t *b;

	if (p->in_body || !(b = malloc(WIRE_HDR + len)))
		return;
	wire_put(b, WIRE_CTRL, 0, (uint32_t)len, 0, 0);
	protobuf_c_message_pack(&msg->base, b + WIRE_HDR);
	peer_rx_stream(p, b, WIRE_HDR + len);
	free(b);
}

static const char *name_of(uint64_t v)
{
	static const char *const names[NAMES] = { "fa", "fb", "fc" };

	return names[v % NAMES];
}

static void op_open(struct peer *p, struct input *in)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerFlowOpen op = FLOWMOVER__PEER_FLOW_OPEN__INIT;
	uint64_t which = take(in, 1), size = 4096u << (take(in, 1) % 3);

	op.name = (char *)name_of(which);
	op.flow_id = (uint32_t)(take(in, 1) % 4);
	op.ring_size = size;
	op.max_record = (uint32_t)size / 4;
	op.seal_key = 0x5eed0000ull << (which % NAMES);
	op.start = take(in, 1) * FR_ALIGN;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_OPEN;
	msg.open = &op;
	deliver_msg(p, &msg);
}

static void op_simple(struct peer *p, enum op o, struct input *in)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerHello hello = FLOWMOVER__PEER_HELLO__INIT;
	Flowmover__PeerFlowClose cl = FLOWMOVER__PEER_FLOW_CLOSE__INIT;

	if (o == OP_HELLO) {
		hello.version = WIRE_VERSION;
		hello.node = "fuzz";
		msg.body_case = FLOWMOVER__PEER_MSG__BODY_HELLO;
		msg.hello = &hello;
	} else {
		cl.name = (char *)name_of(take(in, 1));
		msg.body_case = FLOWMOVER__PEER_MSG__BODY_CLOSE;
		msg.close = &cl;
	}
	deliver_msg(p, &msg);
}

/* ---- the receiving host --------------------------------------------------- */

static struct fr_ring *receiver_ring(struct input *in)
{
	struct flow *f = flows_find(&table, name_of(take(in, 1)));

	return f && f->role == FLOW_RECEIVER ? &f->view->ring : NULL;
}

static void op_host(enum op o, struct input *in)
{
	struct fr_ring *r;
	struct flow *f;

	switch (o) {
	case OP_DESTROY:
		f = flows_find(&table, name_of(take(in, 1)));
		if (f)
			peer_destroy_flow(&mgr, f, "destroyed by the fuzzer");
		break;
	case OP_HEAD: /* a consumer writing anything into its own ring */
		r = receiver_ring(in);
		if (r)
			atomic_store(&r->sh->subs[take(in, 1) % FR_MAX_SUBS].pos,
				     take(in, 2) * FR_ALIGN);
		break;
	case OP_CATCH_UP: /* an honest consumer */
		r = receiver_ring(in);
		if (r)
			atomic_store(&r->sh->floor,
				     atomic_load(&r->sh->published));
		break;
	case OP_DUTY:
		peer_do_work(&mgr);
		break;
	case OP_RECV_ENDS:
		if (n_zombies)
			zombie[--n_zombies]->rd_op.busy = false;
		break;
	default:
		break;
	}
}

static void op_conn(struct peer **slot, enum op o, struct input *in)
{
	struct peer *p = *slot;

	if (o == OP_CONNECT) {
		if (!p && (p = peer_new(&mgr, "fuzz:1", false, &fake))) {
			*slot = p;
			p->rd_op.busy = true; /* a receive is always armed */
			peer_up(p);
		}
		return;
	}
	if (!p)
		return;
	switch (o) {
	case OP_HELLO:
	case OP_CLOSE:
		op_simple(p, o, in);
		break;
	case OP_OPEN:
		op_open(p, in);
		break;
	case OP_DATA:
		deliver_header(p, WIRE_DATA, (uint32_t)(take(in, 1) % 4),
			       (uint32_t)take(in, 2) * FR_ALIGN,
			       take(in, 2) * FR_ALIGN, 0);
		break;
	case OP_BODY:
		deliver_body(p, in, 1 + take(in, 2) % 8192);
		break;
	case OP_ACK:
		deliver_header(p, WIRE_ACK, (uint32_t)(take(in, 1) % 4), 0,
			       take(in, 2) * FR_ALIGN, take(in, 2) * FR_ALIGN);
		break;
	case OP_RAW:
		if (!p->in_body)
			deliver_raw(p, in, WIRE_HDR);
		break;
	case OP_STREAM:
		deliver_raw(p, in, 1 + take(in, 1) % 96);
		break;
	case OP_DISCONNECT:
		peer_fail(p, "fuzz: connection lost");
		break;
	case OP_SENT:
		if (p->wr_op.busy) {
			p->wr_op.busy = false;
			peer_sent(p);
		}
		break;
	default:
		break;
	}
}

/* ---- one input ------------------------------------------------------------ */

static void teardown(void)
{
	for (int i = 0; i < CONNS; i++)
		if (conn[i])
			peer_fail(conn[i], "fuzz: end of input");
	settle();
	while (n_zombies)
		zombie[--n_zombies]->rd_op.busy = false;
	peer_do_work(&mgr); /* reaps every failed peer */
	while (table.head)
		peer_destroy_flow(&mgr, table.head, NULL);
	if (mgr.peers || table.count) {
		fprintf(stderr, "fuzz_peer: left %s after the input\n",
			mgr.peers ? "a peer" : "a flow");
		abort();
	}
}

static char dir[64];

static bool opened; /* did any input open a flow? */

static void remove_dir(void)
{
	rmdir(dir); /* every ring file went with its flow */
	/* a run that never opened a flow fuzzed nothing but the handshake
	 * (limits or protocol changed under the fuzzer): fail it */
	if (!opened) {
		fprintf(stderr, "fuzz_peer: no input opened a flow\n");
		_exit(1);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct flow_limits lim = { .default_ring_size = 4096,
				   .default_max_record = 1024,
				   .max_ring_size = 16384, .max_flows = 8,
				   .peer_max_flows = 8,
				   .peer_max_ring_bytes = 1 << 20,
				   .uid_max_flows = 8,
				   .uid_max_ring_bytes = 1 << 20 };

	(void)argc;
	(void)argv;
	snprintf(dir, sizeof(dir), "/dev/shm/fuzz_peer-%d", (int)getpid());
	mkdir(dir, 0700);
	atexit(remove_dir);
	log_setup(LOG_LVL_ERROR, 0);
	flows_init(&table, &lim, dir, open(dir, O_RDONLY | O_DIRECTORY |
						 O_CLOEXEC));
	mgr = (struct peer_mgr){ .flows = &table, .flow_gone = forget_attachments,
				 .flow_gone_arg = &ctl, .tp = &fake,
				 .listen_fd = -1, .bell_mode = BELL_POLL };
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct input in = { data, size };

	while (in.n) {
		uint8_t c = (uint8_t)take(&in, 1);
		enum op o = (enum op)((c >> 1) % OP_COUNT);

		if (o >= OP_RECV_ENDS && o <= OP_DUTY)
			op_host(o, &in);
		else
			op_conn(&conn[c & 1], o, &in);
		settle();
		opened |= table.count > 0;
	}
	teardown();
	return 0;
}
