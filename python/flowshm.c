/*
 * python/flowshm.c - the CPython module `flowshm`, over the public
 * libflowshm/flowshm.h only.
 *
 * The types:
 *   Flow         an open end of a flow (attach by name, or open_fd)
 *   Reservation  a claimed record a producer writes in place (reserve)
 *   Record       the next record a consumer looks at in place (peek)
 *   Batch        the next records in place, one memoryview each
 *                (peek_batch), released together
 *   Set          consumer Flows waited on together, with a descriptor
 *                for event loops (flowshm_set)
 *
 * Memory lifetime: Reservation and Record export the ring's memory through
 * the buffer protocol and count their exports.  Committing, releasing or
 * closing while a view is exported is refused (BufferError): a view, or a
 * numpy array made from it, can never outlive the ring memory it points
 * into.  Every view holds a reference to its Reservation/Record, which holds
 * one to its Flow, so garbage collection cannot unmap the ring under a view
 * either.  The views are held back only weakly, so a dropped Record,
 * Reservation or Batch goes at once, not with the cyclic collector.  A
 * memoryview released by Record.release() raises ValueError on
 * use (CPython's own check).  A Batch exports one buffer per record, the
 * memoryviews it hands out; its release releases them all first, so every
 * view of a released batch raises ValueError on use.
 *
 * Threads: a handle belongs to one thread at a time (flowshm.h).  Every
 * call marks its Flow busy while it runs (and while the GIL is released for
 * a wait); a second thread's call on the same Flow meanwhile, close()
 * included, raises RuntimeError instead of racing on the handle.
 *
 * Fork: handles belong to the process that opened them (see "fork").
 *
 * Waits release the GIL and sleep in slices of at most WAIT_SLICE_NS, so
 * Ctrl-C (and any other signal handler) runs within that time.
 *
 * FM_HAVE_PIPELINE_API: flowshm.h has the pipeline calls of issue 11 and
 * 15 (end of stream, flow state, poll and fd sets, producer identity);
 * the module offers end(), state(), poll(), fileno() and EndOfStream then.
 * FLOWSHM_HAVE_SET_WAIT: flowshm_set_wait (issue 12); Flow.set_wait().
 * FLOWSHM_HAVE_ATTACH_OWNED: flowshm_attach_owned; attach(owner=).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "flowshm.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_NS 100000000LL	/* 0.1 s: signal latency in a wait */

#ifdef FLOWSHM_POLL_MAX
#define FM_HAVE_PIPELINE_API 1
#endif
#define BATCH_MAX 1024u			/* records per library batch call */

static PyObject *flowshm_error;		/* flowshm.Error(OSError) */
#ifdef FM_HAVE_PIPELINE_API
static PyObject *end_of_stream;		/* flowshm.EndOfStream(Error) */
#endif

/* ---- errors ------------------------------------------------------------ */

/* The exception for a library return code: the builtin OSError subclass
 * Python programs already catch where one fits, else flowshm.Error. */
static PyObject *exc_type_for(int rc)
{
	switch (rc) {
	case -EAGAIN: return PyExc_BlockingIOError;
	case -ETIMEDOUT:
	case -ENOTCONN:		/* timed out: the flow's peer link is down */
	case -EHOSTDOWN:	/* timed out: moverd is gone, the ring full */
		return PyExc_TimeoutError;
	case -EPIPE: return PyExc_BrokenPipeError;
	case -EACCES:
	case -EPERM: return PyExc_PermissionError;
	case -ENOENT: return PyExc_FileNotFoundError;
#ifdef FM_HAVE_PIPELINE_API
	case -ENODATA: return end_of_stream;
#endif
	default: return flowshm_error;
	}
}

/* Raise for rc with the library's words, prefixed by what failed. */
static PyObject *raise_rc_msg(int rc, const char *what, const char *detail)
{
	PyObject *args, *exc;

	if (detail && *detail)
		args = Py_BuildValue("(is)", -rc, detail);
	else
		args = Py_BuildValue("(iN)", -rc, PyUnicode_FromFormat(
			"%s: %s", what, flowshm_strerror(rc)));
	if (!args)
		return NULL;
	exc = PyObject_Call(exc_type_for(rc), args, NULL);
	Py_DECREF(args);
	if (exc) {
		PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
		Py_DECREF(exc);
	}
	return NULL;
}

static PyObject *raise_rc(int rc, const char *what)
{
	return raise_rc_msg(rc, what, NULL);
}

/* A timeout in seconds (float, None = forever) as flowshm.h's nanoseconds. */
static int timeout_ns_of(PyObject *o, int64_t *ns)
{
	double s;

	if (!o || o == Py_None) {
		*ns = -1;
		return 0;
	}
	s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (isnan(s) || s < 0) {
		PyErr_SetString(PyExc_ValueError,
				"timeout must be >= 0 seconds or None");
		return -1;
	}
	*ns = s >= 9e9 ? -1 : (int64_t)(s * 1e9);
	return 0;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- fork -------------------------------------------------------------- */

/*
 * A child of fork() inherits the Flow and Set objects but not what they
 * stand for: a handle's producer or subscriber slot in the shared ring is
 * the parent's (closing it in the child frees the parent's slot, and the
 * parent's consumer is cut off), and a set's helper thread is not forked
 * (destroying the set in the child would wait for it forever).  So every
 * Flow and Set records the pid that made it; in another process its calls
 * raise, and close and dealloc only forget the handle: left allocated and
 * mapped, the shared memory untouched.  cur_pid is getpid(), kept by an
 * atfork handler instead of a system call at every call.
 */
static pid_t cur_pid;

static void after_fork_child(void)
{
	cur_pid = getpid();
}

static bool forked(pid_t owner)
{
	return owner != cur_pid;
}

static int raise_forked(void)
{
	PyErr_SetString(PyExc_RuntimeError, "used after fork: handles belong "
			"to the process that opened them");
	return -1;
}

/* ---- memoryviews, weakly held ------------------------------------------- */

/*
 * A Record, Reservation or Batch keeps only weak references to the
 * memoryviews it hands out: each view holds its owner (the buffer's
 * exporter), so a strong reference back would be a cycle, and a dropped
 * Record or Batch would stay live (holding its flow's slot, a claim
 * blocking every producer) until the cyclic collector ran.  Its finish
 * releases the views still alive.
 */

/* The view behind weakref ref (NULL: none made), as a new reference, or
 * NULL if it is gone. */
static PyObject *view_of(PyObject *ref)
{
	PyObject *v;

	if (!ref)
		return NULL;
#if PY_VERSION_HEX >= 0x030D0000
	if (PyWeakref_GetRef(ref, &v) < 0)
		PyErr_Clear();	/* not a weakref: cannot be */
	return v;
#else
	v = PyWeakref_GetObject(ref);
	return v == Py_None ? NULL : Py_NewRef(v);
#endif
}

/* Remember view v in *ref (replacing a dead view's weakref). */
static int weak_view(PyObject *v, PyObject **ref)
{
	PyObject *w = PyWeakref_NewRef(v, NULL);

	if (!w)
		return -1;
	Py_XSETREF(*ref, w);
	return 0;
}

/* Release the view behind ref if it is still alive: -1 with BufferError
 * when something (a numpy array, a slice) still uses its buffer. */
static int release_view(PyObject *ref)
{
	PyObject *v = view_of(ref), *res;

	if (!v)
		return 0;
	res = PyObject_CallMethod(v, "release", NULL);
	Py_DECREF(v);
	if (!res)
		return -1;
	Py_DECREF(res);
	return 0;
}

/* ---- Flow -------------------------------------------------------------- */

struct rec_obj;

typedef struct {
	PyObject_HEAD
	flowshm_t *f;
	pid_t pid;		/* the process that opened it (fork) */
	int role;		/* FLOWSHM_PRODUCER or FLOWSHM_CONSUMER */
	int busy;		/* a call runs (maybe without the GIL) */
	bool peeked;		/* the library holds a peeked record: a
				   Record's, or one let go unconsumed */
	uint32_t max_record;
	PyObject *name;		/* str, or None for open_fd */
	struct rec_obj *held;	/* the live Reservation or Record, if any */
	PyObject *weakrefs;
#ifdef FM_HAVE_PIPELINE_API
	flowshm_set_t *set;	/* fileno()'s one-flow set, made on demand */
	struct batch_obj *batch;	/* the live Batch, if any */
	struct flowshm_rec *brecs;	/* the batch the library holds: */
	unsigned bn;			/* bn records (0: none), of the live
					   Batch or pending (left unreleased) */
	struct set_obj **sets;	/* the Sets this flow is in (they hold it) */
	Py_ssize_t nsets;
#endif
} FlowObject;

/* A Reservation (producer) or a Record (consumer). */
typedef struct rec_obj {
	PyObject_HEAD
	FlowObject *flow;	/* strong reference while live */
	char *buf;
	Py_ssize_t len;
	Py_ssize_t exports;	/* buffers handed out and not yet released */
	PyObject *view;		/* weakref to the memoryview of with/view, if
				   made: a strong one would be a cycle (the
				   view holds us) and keep a dropped Record
				   or Reservation live until the collector
				   ran */
	int live;		/* not yet committed/released */
} RecObject;

static PyTypeObject FlowType, ReservationType, RecordType;
#ifdef FM_HAVE_PIPELINE_API
static PyTypeObject BatchType, SetType;
static void flow_leave_sets(FlowObject *fo);
#endif

/* Take the handle for one call: it must be open and not in use. */
static int flow_enter(FlowObject *fo)
{
	if (forked(fo->pid))
		return raise_forked();
	if (!fo->f) {
		PyErr_SetString(PyExc_ValueError, "I/O operation on closed flow");
		return -1;
	}
	if (fo->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"flow in use by another thread: a handle "
				"belongs to one thread at a time");
		return -1;
	}
	fo->busy = 1;
	return 0;
}

static void flow_leave(FlowObject *fo)
{
	fo->busy = 0;
}

typedef int (*try_fn)(FlowObject *fo, void *arg, int64_t timeout_ns);

/* A wait that ran out: -ETIMEDOUT, or (a producer's, flowshm.h) the
 * reason it ran out when that was not a slow consumer. */
static bool timed_out(int rc)
{
	return rc == -ETIMEDOUT || rc == -ENOTCONN || rc == -EHOSTDOWN;
}

/*
 * Run try(timeout 0) with the GIL held (the fast path: no wait, no GIL
 * traffic); if it would wait, release the GIL and retry in slices until
 * the timeout runs out, checking for signals between slices.  A slice that
 * times out is no error until the whole timeout has: then the last
 * slice's code says why.  Returns the library's code, or 1 when a signal
 * handler raised.
 */
static int run_waiting(FlowObject *fo, try_fn try, void *arg,
		       int64_t timeout_ns)
{
	int64_t deadline;
	int rc = try(fo, arg, 0), last = -ETIMEDOUT;

	if (rc != -EAGAIN || timeout_ns == 0)
		return rc;
	deadline = timeout_ns < 0 ? -1 : now_ns() + timeout_ns;
	for (;;) {
		int64_t slice = WAIT_SLICE_NS;

		if (deadline >= 0) {
			int64_t left = deadline - now_ns();

			if (left <= 0)
				return last;
			if (left < slice)
				slice = left;
		}
		Py_BEGIN_ALLOW_THREADS
		rc = try(fo, arg, slice);
		Py_END_ALLOW_THREADS
		if (!timed_out(rc))
			return rc;
		last = rc;
		if (PyErr_CheckSignals())
			return 1;
	}
}

/* In a child of fork: let go of the parent's handle and fileno set without
 * a library call (see "fork"); they are leaked. */
static void flow_forget_handle(FlowObject *fo)
{
	fo->f = NULL;	/* first: set_drop leaves the library alone then */
	fo->peeked = false;
#ifdef FM_HAVE_PIPELINE_API
	fo->set = NULL;
	flow_leave_sets(fo);
	PyMem_Free(fo->brecs);
	fo->brecs = NULL;
	fo->bn = 0;
#endif
}

static void flow_close_handle(FlowObject *fo)
{
	if (!fo->f)
		return;
	if (forked(fo->pid)) {
		flow_forget_handle(fo);
		return;
	}
#ifdef FM_HAVE_PIPELINE_API
	if (fo->set) {	/* a set must not outlive its handles */
		flowshm_set_destroy(fo->set);
		fo->set = NULL;
	}
	flow_leave_sets(fo);	/* the same for the Sets it is in */
	PyMem_Free(fo->brecs);	/* a pending batch goes with the handle */
	fo->brecs = NULL;
	fo->bn = 0;
#endif
	if (fo->name != Py_None)
		flowshm_detach(fo->f);
	else
		flowshm_close(fo->f);
	fo->f = NULL;
	fo->peeked = false;
}

static FlowObject *flow_new(flowshm_t *f, int role, PyObject *name)
{
	FlowObject *fo = PyObject_New(FlowObject, &FlowType);
	struct flowshm_info info;

	if (!fo) {
		flowshm_close(f);
		return NULL;
	}
	fo->f = f;
	fo->pid = cur_pid;
	fo->role = role;
	fo->busy = 0;
	fo->peeked = false;
	fo->held = NULL;
	fo->weakrefs = NULL;
#ifdef FM_HAVE_PIPELINE_API
	fo->set = NULL;
	fo->batch = NULL;
	fo->brecs = NULL;
	fo->bn = 0;
	fo->sets = NULL;
	fo->nsets = 0;
#endif
	fo->name = name;
	Py_INCREF(name);
	fo->max_record = flowshm_info(f, &info) ? 0 : info.max_record;
	return fo;
}

static int role_of(const char *s)
{
	if (!strcmp(s, "producer"))
		return FLOWSHM_PRODUCER;
	if (!strcmp(s, "consumer"))
		return FLOWSHM_CONSUMER;
	PyErr_Format(PyExc_ValueError,
		     "role must be 'producer' or 'consumer', not '%s'", s);
	return 0;
}

static int opts_of(PyObject *recover, struct flowshm_opts *o)
{
	int64_t ns;

	memset(o, 0, sizeof(*o));
	if (!recover)
		return 0;
	if (recover == Py_None) {
		o->recover_ns = UINT64_MAX;
		return 0;
	}
	if (timeout_ns_of(recover, &ns))
		return -1;
	o->recover_ns = ns < 0 ? UINT64_MAX : (ns ? (uint64_t)ns : 1);
	return 0;
}

PyDoc_STRVAR(attach_doc,
"attach(name, role, *, recover=<default>, owner=None) -> Flow\n\n"
"Ask moverd (socket: $FLOWMOVER_SOCKET, else /run/flowmover/moverd.sock)\n"
"for flow `name` and open its 'producer' or 'consumer' end.  `recover`\n"
"(consumer, seconds; None = never) is how long a record may stay claimed\n"
"and uncommitted before the consumer checks whether its producer died.\n"
"`owner` (a uid; os.getuid() for a flow of your own): attach only if\n"
"that user owns the flow, not to one someone else created under the\n"
"name first (PermissionError naming its owner).\n"
"Raises FileNotFoundError (no such flow), PermissionError, or\n"
"flowshm.Error (moverd not running, flow busy, ...) with moverd's words.");

/* owner: None, or a uid (0 .. 2^32-2; -1 is no uid) */
static int owner_of(PyObject *owner, int64_t *out)
{
	unsigned long long v;

	*out = -1;
	if (!owner || owner == Py_None)
		return 0;
	v = PyLong_AsUnsignedLongLong(owner);
	if (PyErr_Occurred() || v >= UINT32_MAX) {
		PyErr_Clear();
		PyErr_SetString(PyExc_ValueError,
				"owner must be None or a uid (0..4294967294)");
		return -1;
	}
	*out = (int64_t)v;
	return 0;
}

/* str as UTF-8 for C, refusing an embedded NUL: C would see a shorter
 * string (attach("a\0b") would attach "a"). */
static const char *utf8_of(PyObject *str, const char *what)
{
	Py_ssize_t n;
	const char *s = PyUnicode_AsUTF8AndSize(str, &n);

	if (s && strlen(s) != (size_t)n) {
		PyErr_Format(PyExc_ValueError, "%s: embedded null character",
			     what);
		return NULL;
	}
	return s;
}

static PyObject *py_attach(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "role", "recover", "owner", NULL };
	const char *role_s;
	PyObject *name, *recover = NULL, *owner_o = NULL;
	struct flowshm_opts o;
	flowshm_t *f = NULL;
	int64_t owner;
	char err[512];
	int role, rc;

	(void)self;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "Us|$OO:attach", kwlist,
					 &name, &role_s, &recover, &owner_o))
		return NULL;
	if (!(role = role_of(role_s)) || opts_of(recover, &o) ||
	    owner_of(owner_o, &owner))
		return NULL;
#ifndef FLOWSHM_HAVE_ATTACH_OWNED
	if (owner >= 0) {
		PyErr_SetString(PyExc_NotImplementedError, "attach(owner=) "
				"needs a newer libflowshm");
		return NULL;
	}
#endif
	const char *cname = utf8_of(name, "attach: name");
	if (!cname)
		return NULL;
	Py_BEGIN_ALLOW_THREADS	/* a control round trip to moverd */
#ifdef FLOWSHM_HAVE_ATTACH_OWNED
	rc = owner >= 0 ? flowshm_attach_owned(cname, role, (uint32_t)owner,
					       &o, 0, &f) :
			  flowshm_attach(cname, role, &o, &f);
#else
	rc = flowshm_attach(cname, role, &o, &f);
#endif
	if (rc)	/* the words are per thread: copy them on this one */
		snprintf(err, sizeof(err), "%s", flowshm_attach_error());
	Py_END_ALLOW_THREADS
	if (rc)
		return raise_rc_msg(rc, "attach", err);
	return (PyObject *)flow_new(f, role, name);
}

PyDoc_STRVAR(open_fd_doc,
"open_fd(fd, role, *, recover=<default>) -> Flow\n\n"
"Open an end of the ring behind file descriptor `fd` (from ring_create or\n"
"received from another process) without moverd.  The fd may be closed\n"
"afterwards.");

static PyObject *py_open_fd(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "fd", "role", "recover", NULL };
	const char *role_s;
	PyObject *recover = NULL;
	struct flowshm_opts o;
	flowshm_t *f = NULL;
	int fd, role, rc;

	(void)self;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "is|$O:open_fd", kwlist,
					 &fd, &role_s, &recover))
		return NULL;
	if (!(role = role_of(role_s)) || opts_of(recover, &o))
		return NULL;
	rc = flowshm_open_fd(fd, role, &o, &f);
	if (rc)
		return raise_rc(rc, "open_fd");
	return (PyObject *)flow_new(f, role, Py_None);
}

PyDoc_STRVAR(ring_create_doc,
"ring_create(ring_size, max_record, path=None, *, deposit=False) -> int\n\n"
"Create and format a ring and return its file descriptor (close-on-exec;\n"
"the caller closes it).  ring_size: bytes, a power of two >= 4096;\n"
"max_record: 1..ring_size/2 (OverflowError for sizes C cannot hold).\n"
"path None: an anonymous sealed memfd.");

/* An int in 0..max, or OverflowError: no silent wrap of what the C
 * type cannot hold (2**64 + 65536 would be a 64 KiB ring). */
static int u64_of(PyObject *o, uint64_t max, const char *what, uint64_t *out)
{
	PyObject *i = PyNumber_Index(o);
	unsigned long long v;

	if (!i)
		return -1;
	v = PyLong_AsUnsignedLongLong(i);	/* OverflowError < 0, >= 2**64 */
	Py_DECREF(i);
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	if (v > max) {
		PyErr_Format(PyExc_OverflowError, "%s must be 0..%llu", what,
			     (unsigned long long)max);
		return -1;
	}
	*out = v;
	return 0;
}

static PyObject *py_ring_create(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "ring_size", "max_record", "path",
				  "deposit", NULL };
	PyObject *osize, *omax, *path = Py_None, *bpath = NULL;
	int deposit = 0, fd = -1, rc;
	struct flowshm_ring_params p;
	uint64_t max_record;

	(void)self;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O$p:ring_create", kwlist,
					 &osize, &omax, &path, &deposit))
		return NULL;
	if (u64_of(osize, UINT64_MAX, "ring_size", &p.ring_size) ||
	    u64_of(omax, UINT32_MAX, "max_record", &max_record))
		return NULL;
	if (path != Py_None && !PyUnicode_FSConverter(path, &bpath))
		return NULL;
	p.max_record = (uint32_t)max_record;
	p.flags = deposit ? FLOWSHM_RING_DEPOSIT : 0;
	rc = flowshm_ring_create(&p, bpath ? PyBytes_AS_STRING(bpath) : NULL,
				 &fd);
	Py_XDECREF(bpath);
	if (rc)
		return raise_rc(rc, "ring_create");
	return PyLong_FromLong(fd);
}

PyDoc_STRVAR(strerror_doc,
"strerror(errno) -> str\n\n"
"The library's words for an error number (positive, as in OSError.errno).");

static PyObject *py_strerror(PyObject *self, PyObject *arg)
{
	long e = PyLong_AsLong(arg);

	(void)self;
	if (e == -1 && PyErr_Occurred())
		return NULL;
	/* as an int, and negated: -INT_MAX..INT_MAX (-INT_MIN overflows) */
	if (e < -INT_MAX || e > INT_MAX) {
		PyErr_SetString(PyExc_OverflowError,
				"strerror: errno out of range");
		return NULL;
	}
	return PyUnicode_FromString(flowshm_strerror(e < 0 ? (int)e : -(int)e));
}

/* Refuse producer calls on a consumer handle and the reverse. */
static int check_role(FlowObject *fo, int role, const char *what)
{
	char msg[96];

	if (fo->role == role)
		return 0;
	snprintf(msg, sizeof(msg), "%s: needs a %s end", what,
		 role == FLOWSHM_PRODUCER ? "producer" : "consumer");
	raise_rc_msg(-EINVAL, what, msg);
	return -1;
}

/* Refuse a call while a Reservation/Record is held: the library handle
 * has one such slot, and reusing it would publish or drop the wrong one. */
static int check_not_held(FlowObject *fo, const char *what)
{
#ifdef FM_HAVE_PIPELINE_API
	if (fo->bn) {	/* the library refuses every read meanwhile */
		PyErr_Format(PyExc_RuntimeError, fo->batch ?
			     "%s: a peeked batch is still open on this flow: "
			     "release it first" :
			     "%s: a batch left unreleased is pending on this "
			     "flow: peek_batch() hands it out again, "
			     "release_batch() consumes it", what);
		return -1;
	}
#endif
	if (!fo->held)
		return 0;
	PyErr_Format(PyExc_RuntimeError,
		     "%s: a %s is still open on this flow: %s it first", what,
		     fo->role == FLOWSHM_PRODUCER ? "reservation" : "peeked "
		     "record", fo->role == FLOWSHM_PRODUCER ? "commit" :
		     "release");
	return -1;
}

/* Take the flow for a call of `role` that needs no held record. */
static int flow_begin(FlowObject *fo, int role, const char *what)
{
	if (flow_enter(fo))
		return -1;
	if (check_role(fo, role, what) || check_not_held(fo, what)) {
		flow_leave(fo);
		return -1;
	}
	return 0;
}

/* send */
struct send_arg { const void *data; size_t len; };

static int try_send(FlowObject *fo, void *arg, int64_t t)
{
	struct send_arg *a = arg;

	return flowshm_send(fo->f, a->data, a->len, t);
}

PyDoc_STRVAR(send_doc,
"send(data, timeout=None)\n\n"
"Send one record (any bytes-like object, copied into the ring).  Waits\n"
"up to `timeout` seconds (None: forever, 0: not at all) while the ring\n"
"is full: BlockingIOError (timeout 0) or TimeoutError when it stays\n"
"full (its errno says why where the library tells: ETIMEDOUT a slow\n"
"consumer, ENOTCONN the flow's link to its peer host is down, EHOSTDOWN\n"
"moverd is gone), BrokenPipeError when the flow is closed.");

static PyObject *flow_send(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "data", "timeout", NULL };
	PyObject *tmo = Py_None;
	Py_buffer b;
	int64_t t;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|O:send", kwlist, &b,
					 &tmo))
		return NULL;
	if (timeout_ns_of(tmo, &t) || flow_begin(fo, FLOWSHM_PRODUCER,
						 "send")) {
		PyBuffer_Release(&b);
		return NULL;
	}
	struct send_arg a = { b.buf, (size_t)b.len };
	/* b stays exported (pinned) while the GIL is released */
	rc = run_waiting(fo, try_send, &a, t);
	flow_leave(fo);
	PyBuffer_Release(&b);
	if (rc == 1)
		return NULL;
	if (rc)
		return raise_rc(rc, "send");
	Py_RETURN_NONE;
}

/* send_batch */
struct batch_arg { const struct iovec *v; unsigned n, sent; };

static int try_send_batch(FlowObject *fo, void *arg, int64_t t)
{
	struct batch_arg *a = arg;

	return flowshm_send_batch(fo->f, a->v, a->n, &a->sent, t);
}

PyDoc_STRVAR(send_batch_doc,
"send_batch(records, timeout=None) -> int\n\n"
"Send every record of the sequence `records` (bytes-like objects), in\n"
"order, several per claim of the ring.  `timeout` bounds the whole call;\n"
"if it runs out (or the flow closes) part way, the exception's `sent`\n"
"attribute says how many records went.  Returns len(records).");

static PyObject *send_batch_error(int rc, Py_ssize_t sent)
{
	PyObject *type, *val, *tb, *n;

	if (rc != 1)
		raise_rc(rc, "send_batch");
	PyErr_Fetch(&type, &val, &tb);
	PyErr_NormalizeException(&type, &val, &tb);
	if (val && (n = PyLong_FromSsize_t(sent))) {
		if (PyObject_SetAttrString(val, "sent", n))
			PyErr_Clear();
		Py_DECREF(n);
	}
	PyErr_Restore(type, val, tb);
	return NULL;
}

/*
 * The items of an iterable as a new tuple (as PySequence_Fast takes them,
 * TypeError `msg` for another object).  A snapshot, not the caller's list:
 * it holds its items and cannot change while we use them, also while the
 * GIL is released or code we call runs and another thread changes the
 * list (or drops the last reference to an item).
 */
static PyObject *seq_snapshot(PyObject *o, const char *msg)
{
	PyObject *it, *t;

	if (PyList_CheckExact(o) || PyTuple_CheckExact(o))
		return PySequence_Tuple(o);
	it = PyObject_GetIter(o);
	if (!it) {
		if (PyErr_ExceptionMatches(PyExc_TypeError))
			PyErr_SetString(PyExc_TypeError, msg);
		return NULL;
	}
	t = PySequence_Tuple(it);
	Py_DECREF(it);
	return t;
}

static PyObject *flow_send_batch(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "records", "timeout", NULL };
	PyObject *recs, *seq, *tmo = Py_None, *ret = NULL;
	Py_buffer *bufs = NULL;
	struct iovec *v = NULL;
	Py_ssize_t n, got = 0, done = 0;
	int64_t t, deadline;
	int rc = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:send_batch", kwlist,
					 &recs, &tmo) || timeout_ns_of(tmo, &t))
		return NULL;
	seq = seq_snapshot(recs, "send_batch: records must be a sequence");
	if (!seq)
		return NULL;
	n = PyTuple_GET_SIZE(seq);
	bufs = PyMem_Calloc(n ? n : 1, sizeof(*bufs));
	v = PyMem_Calloc(n ? n : 1, sizeof(*v));
	if (!bufs || !v) {
		PyErr_NoMemory();
		goto out;
	}
	for (; got < n; got++) {
		PyObject *o = PyTuple_GET_ITEM(seq, got);

		if (PyObject_GetBuffer(o, &bufs[got], PyBUF_SIMPLE))
			goto out;
		v[got] = (struct iovec){ bufs[got].buf, (size_t)bufs[got].len };
	}
	if (flow_begin(fo, FLOWSHM_PRODUCER, "send_batch"))
		goto out;
	deadline = t < 0 ? -1 : now_ns() + t;
	while (done < n) {
		struct batch_arg a = { v + done, 0, 0 };
		int64_t left = -1;

		a.n = n - done < BATCH_MAX ? (unsigned)(n - done) : BATCH_MAX;
		if (deadline >= 0 && (left = deadline - now_ns()) < 0)
			left = 0;
		rc = run_waiting(fo, try_send_batch, &a, left);
		if (rc)
			break;
		done += a.sent;
	}
	flow_leave(fo);
	if (rc)
		send_batch_error(rc, done);
	else
		ret = PyLong_FromSsize_t(done);
out:
	for (Py_ssize_t i = 0; i < got; i++)
		PyBuffer_Release(&bufs[i]);
	PyMem_Free(bufs);
	PyMem_Free(v);
	Py_DECREF(seq);
	return ret;
}

/* peek (and recv on top of it) */
struct peek_arg { const void *buf; size_t len; };

/*
 * After a read found nothing, a flow whose fileno() an event loop watches
 * must have its set polled once without waiting: that -EAGAIN is what arms
 * the descriptor again (flowshm_set_fd).  Returns 1 when the set says a
 * record came meanwhile (read again), else 0.
 */
static int rearm(FlowObject *fo)
{
#ifdef FM_HAVE_PIPELINE_API
	flowshm_t *ready;
	unsigned n;

	if (fo->set)
		return flowshm_set_poll(fo->set, &ready, 1, &n, 0) == 0;
#else
	(void)fo;
#endif
	return 0;
}

static int try_peek(FlowObject *fo, void *arg, int64_t t)
{
	struct peek_arg *a = arg;
	int rc;

	do
		rc = flowshm_peek(fo->f, &a->buf, &a->len, t);
	while (rc == -EAGAIN && t == 0 && rearm(fo));
	return rc;
}

PyDoc_STRVAR(recv_doc,
"recv(timeout=None) -> bytes\n\n"
"Receive the next record as a new bytes object (one copy).  Waits up to\n"
"`timeout` seconds while the ring is empty: BlockingIOError (timeout 0)\n"
"or TimeoutError when it stays empty; BrokenPipeError when the flow is\n"
"closed and everything in it has been received.");

/* Release (consume) the record the library holds peeked, as flowshm_recv
 * would after its copy: -ESTALE if cut off meanwhile (flowshm.h). */
static int flow_release_peek(FlowObject *fo)
{
	fo->peeked = false;	/* gone from the library either way */
	return flowshm_release(fo->f);
}

/* The next record as bytes, or NULL with *rc set (1: exception raised). */
static PyObject *recv_one(FlowObject *fo, int64_t t, int *rc)
{
	struct peek_arg a;
	PyObject *b;

	*rc = run_waiting(fo, try_peek, &a, t);
	if (*rc)
		return NULL;
	fo->peeked = true;
	b = PyBytes_FromStringAndSize(a.buf, (Py_ssize_t)a.len);
	if (!b) {
		*rc = 1;	/* nothing released: the record stays next */
		return NULL;
	}
	*rc = flow_release_peek(fo);
	if (*rc) {	/* ESTALE: cut off while copying, the copy may be torn */
		Py_DECREF(b);
		return NULL;
	}
	return b;
}

static PyObject *flow_recv(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None, *b;
	int64_t t;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:recv", kwlist, &tmo) ||
	    timeout_ns_of(tmo, &t) ||
	    flow_begin(fo, FLOWSHM_CONSUMER, "recv"))
		return NULL;
	b = recv_one(fo, t, &rc);
	flow_leave(fo);
	if (!b && rc != 1)
		return raise_rc(rc, "recv");
	return b;
}

PyDoc_STRVAR(recv_batch_doc,
"recv_batch(max=64, timeout=None) -> list[bytes]\n\n"
"Receive up to `max` records: waits (per `timeout`) only for the first,\n"
"then takes whatever else is already in the ring.  Never empty: the\n"
"errors are those of recv().");

static PyObject *flow_recv_batch(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "max", "timeout", NULL };
	PyObject *tmo = Py_None, *list, *b;
	Py_ssize_t max = 64;
	int64_t t;
	int rc = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|nO:recv_batch", kwlist,
					 &max, &tmo) || timeout_ns_of(tmo, &t))
		return NULL;
	if (max < 1) {
		PyErr_SetString(PyExc_ValueError, "recv_batch: max must be >= 1");
		return NULL;
	}
	if (flow_begin(fo, FLOWSHM_CONSUMER, "recv_batch"))
		return NULL;
	list = PyList_New(0);
	while (list && PyList_GET_SIZE(list) < max) {
		b = recv_one(fo, PyList_GET_SIZE(list) ? 0 : t, &rc);
		if (!b)
			break;
		if (PyList_Append(list, b))
			Py_CLEAR(list);
		Py_DECREF(b);
	}
	flow_leave(fo);
	if (!list)
		return NULL;
	if (PyList_GET_SIZE(list) == 0) {
		Py_DECREF(list);
		return rc == 1 ? NULL : raise_rc(rc, "recv_batch");
	}
	if (rc == 1)	/* a signal after some records: keep them */
		PyErr_Clear();
	return list;
}

/* Reservation and Record objects */
static RecObject *rec_new(PyTypeObject *type, FlowObject *fo, void *buf,
			  size_t len)
{
	RecObject *r = PyObject_GC_New(RecObject, type);

	if (!r)
		return NULL;
	r->flow = fo;
	Py_INCREF(fo);
	r->buf = buf;
	r->len = (Py_ssize_t)len;
	r->exports = 0;
	r->view = NULL;
	r->live = 1;
	fo->held = r;
	PyObject_GC_Track(r);
	return r;
}

PyDoc_STRVAR(peek_doc,
"peek(timeout=None) -> Record\n\n"
"Look at the next record in place, without copying it.  The Record is a\n"
"read-only bytes-like object (memoryview(rec), numpy.frombuffer(rec) are\n"
"zero copy); use it as `with f.peek() as view:` (view: a read-only\n"
"memoryview, released with the record on exit) or call rec.release().\n"
"The record stays next in the flow until released: a Record dropped\n"
"unreleased, a with block that raises, or close() leave it there for\n"
"the next peek (or peek_batch, as a batch of that one record, or the\n"
"next consumer), so a stage that dies or fails on a record does not\n"
"lose it.  release() raises flowshm.Error (ESTALE) if this consumer was\n"
"cut off (max lag) meanwhile: what was read in place may have been\n"
"overwritten.  Errors as recv().");

static PyObject *flow_peek(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None;
	struct peek_arg a;
	RecObject *r;
	int64_t t;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:peek", kwlist, &tmo) ||
	    timeout_ns_of(tmo, &t) ||
	    flow_begin(fo, FLOWSHM_CONSUMER, "peek"))
		return NULL;
	rc = run_waiting(fo, try_peek, &a, t);
	if (!rc)
		fo->peeked = true;
	flow_leave(fo);
	if (rc == 1)
		return NULL;
	if (rc)
		return raise_rc(rc, "peek");
	r = rec_new(&RecordType, fo, (void *)a.buf, a.len);
	if (!r)	/* nothing was released: the record stays next */
		return NULL;
	return (PyObject *)r;
}

struct reserve_arg { size_t len; void *buf; };

static int try_reserve(FlowObject *fo, void *arg, int64_t t)
{
	struct reserve_arg *a = arg;

	return flowshm_reserve(fo->f, a->len, &a->buf, t);
}

PyDoc_STRVAR(reserve_doc,
"reserve(n, timeout=None) -> Reservation\n\n"
"Claim room for a record of exactly `n` bytes and write it in place.\n"
"Use as `with f.reserve(n) as view:` (view: a writable memoryview of n\n"
"bytes) or write through memoryview(res) and call res.commit().  On exit\n"
"the record is committed, ALSO when the block raises: the ring cannot\n"
"take a claim back (flowshm.h has no abort) and an uncommitted claim\n"
"would stall every producer of the flow, so whatever was written is\n"
"published and the exception propagates.  Errors as send().");

static PyObject *flow_reserve(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "n", "timeout", NULL };
	PyObject *tmo = Py_None;
	struct reserve_arg a;
	Py_ssize_t n;
	RecObject *r;
	int64_t t;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "n|O:reserve", kwlist, &n,
					 &tmo) || timeout_ns_of(tmo, &t))
		return NULL;
	if (n < 0) {
		PyErr_SetString(PyExc_ValueError, "reserve: n must be >= 0");
		return NULL;
	}
	if (flow_begin(fo, FLOWSHM_PRODUCER, "reserve"))
		return NULL;
	a.len = (size_t)n;
	rc = run_waiting(fo, try_reserve, &a, t);
	flow_leave(fo);
	if (rc == 1)
		return NULL;
	if (rc)
		return raise_rc(rc, "reserve");
	r = rec_new(&ReservationType, fo, a.buf, a.len);
	if (!r) {	/* publish it anyway: a claim must not stay open */
		(void)flowshm_commit(fo->f);	/* ours: cannot fail */
		return NULL;
	}
	return (PyObject *)r;
}

/* Iteration: records until the flow is closed and drained. */
static PyObject *flow_iter(FlowObject *fo)
{
	if (check_role(fo, FLOWSHM_CONSUMER, "iteration"))
		return NULL;
	Py_INCREF(fo);
	return (PyObject *)fo;
}

static PyObject *flow_next(FlowObject *fo)
{
	PyObject *b;
	int rc;

	if (flow_begin(fo, FLOWSHM_CONSUMER, "next"))
		return NULL;
	b = recv_one(fo, -1, &rc);
	flow_leave(fo);
	if (b || rc == 1)
		return b;
	if (rc == -EPIPE)	/* closed and drained: the end */
		return NULL;	/* StopIteration, no exception set */
#ifdef FM_HAVE_PIPELINE_API
	if (rc == -ENODATA)	/* end of stream */
		return NULL;
#endif
	return raise_rc(rc, "recv");
}

PyDoc_STRVAR(close_doc,
"close()\n\n"
"Close this end (the flow itself stays; moverd gives a consumer's place\n"
"back).  An open Reservation is committed first; a peeked Record is\n"
"left unreleased (the next consumer gets it).  BufferError if a view of\n"
"either is still in use (release or delete the views, numpy arrays\n"
"included, then close).  Idempotent.");

static int rec_finish(RecObject *r, bool consume);
#ifdef FM_HAVE_PIPELINE_API
static int batch_finish(struct batch_obj *b, bool consume);
#endif

static PyObject *flow_close(FlowObject *fo, PyObject *unused)
{
	(void)unused;
	if (forked(fo->pid))	/* the parent's: only forget it */
		flow_close_handle(fo);
	if (!fo->f)
		Py_RETURN_NONE;
	if (fo->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"close: flow in use by another thread");
		return NULL;
	}
	if (fo->held && rec_finish(fo->held, false))
		return NULL;
#ifdef FM_HAVE_PIPELINE_API
	if (fo->batch && batch_finish(fo->batch, false))
		return NULL;
#endif
	flow_close_handle(fo);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(shutdown_doc,
"shutdown()\n\n"
"Close the flow for everyone: producers get BrokenPipeError, consumers\n"
"receive what is left and then BrokenPipeError (iteration stops).");

static PyObject *flow_shutdown(FlowObject *fo, PyObject *unused)
{
	(void)unused;
	if (flow_enter(fo))
		return NULL;
	flowshm_shutdown(fo->f);
	flow_leave(fo);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(info_doc,
"info() -> dict\n\n"
"The ring's geometry, positions and counters: ring_size, max_record,\n"
"deposit, head, tail, closed, recovered.");

static PyObject *flow_info(FlowObject *fo, PyObject *unused)
{
	struct flowshm_info i;
	int rc;

	(void)unused;
	if (flow_enter(fo))
		return NULL;
	rc = flowshm_info(fo->f, &i);
	flow_leave(fo);
	if (rc)
		return raise_rc(rc, "info");
	return Py_BuildValue("{sKsIsOsKsKsOsI}", "ring_size",
			     (unsigned long long)i.ring_size, "max_record",
			     i.max_record, "deposit",
			     i.flags & FLOWSHM_RING_DEPOSIT ? Py_True : Py_False,
			     "head", (unsigned long long)i.head, "tail",
			     (unsigned long long)i.tail, "closed",
			     i.closed ? Py_True : Py_False, "recovered",
			     i.recovered);
}

#ifdef FLOWSHM_HAVE_SET_WAIT
PyDoc_STRVAR(set_wait_doc,
"set_wait(how) -> None\n\n"
"How this end's calls wait once a short spin found nothing: 'sleep' (the\n"
"default: on the ring's futex, no cpu while nothing comes), 'yield'\n"
"(poll with sched_yield, never asleep: the lowest latency where a few\n"
"processes share each cpu, for a cpu's time while it waits) or 'spin'\n"
"(poll without yielding: for a thread with a cpu of its own).  Waits\n"
"still release the GIL.  ValueError for another word.");

static PyObject *flow_set_wait(FlowObject *fo, PyObject *arg)
{
	static const char *const words[] = { "sleep", "yield", "spin" };
	static const enum flowshm_wait modes[] = {
		FLOWSHM_WAIT_SLEEP, FLOWSHM_WAIT_YIELD, FLOWSHM_WAIT_SPIN,
	};
	const char *how = PyUnicode_Check(arg) ? utf8_of(arg, "set_wait") :
						 NULL;
	int rc;

	for (unsigned i = 0; how && i < 3; i++) {
		if (strcmp(how, words[i]))
			continue;
		if (flow_enter(fo))
			return NULL;
		rc = flowshm_set_wait(fo->f, modes[i]);
		flow_leave(fo);
		if (rc)
			return raise_rc(rc, "set_wait");
		Py_RETURN_NONE;
	}
	if (!PyErr_Occurred())
		PyErr_SetString(PyExc_ValueError,
				"set_wait: 'sleep', 'yield' or 'spin'");
	return NULL;
}
#endif

#ifdef FM_HAVE_PIPELINE_API
static int try_end(FlowObject *fo, void *arg, int64_t t)
{
	(void)arg;
	return flowshm_end(fo->f, t);
}

PyDoc_STRVAR(end_doc,
"end(timeout=None)\n\n"
"Producer: this producer's stream is complete (after its last send).\n"
"Once every producer attached through moverd has ended (or the owner ran\n"
"'moverctl flow end'), consumers get every record and then EndOfStream\n"
"(iteration stops); later sends get BrokenPipeError.  `timeout` matters\n"
"only for a ring from open_fd (the end record waits for room).");

static PyObject *flow_end(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *tmo = Py_None;
	int64_t t;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:end", kwlist, &tmo) ||
	    timeout_ns_of(tmo, &t) || flow_begin(fo, FLOWSHM_PRODUCER, "end"))
		return NULL;
	rc = run_waiting(fo, try_end, NULL, t);
	flow_leave(fo);
	if (rc == 1)
		return NULL;
	if (rc)
		return raise_rc(rc, "end");
	Py_RETURN_NONE;
}

PyDoc_STRVAR(state_doc,
"state() -> dict\n\n"
"The flow's state as moverd last wrote it into the ring, corrected by the\n"
"ring itself: state ('open', 'connecting', 'peer down', 'draining',\n"
"'ended', 'failed', 'closed', 'unknown'), reason (errno when failed, else\n"
"0), since (seconds since the epoch, or None), producers, consumers,\n"
"lag_bytes, daemon ('none', 'up', 'down', 'restarted').");

static const char *daemon_name(enum flowshm_daemon d)
{
	switch (d) {
	case FLOWSHM_DAEMON_UP: return "up";
	case FLOWSHM_DAEMON_DOWN: return "down";
	case FLOWSHM_DAEMON_RESTARTED: return "restarted";
	default: return "none";
	}
}

static PyObject *flow_state(FlowObject *fo, PyObject *unused)
{
	struct flowshm_state st;
	PyObject *since;
	int rc;

	(void)unused;
	if (flow_enter(fo))
		return NULL;
	rc = flowshm_state(fo->f, &st);
	flow_leave(fo);
	if (rc)
		return raise_rc(rc, "state");
	if (st.since_ns)
		since = PyFloat_FromDouble((double)st.since_ns / 1e9);
	else
		since = Py_NewRef(Py_None);
	if (!since)
		return NULL;
	return Py_BuildValue("{sssisNsIsIsKss}", "state",
			     flowshm_state_name(st.state), "reason",
			     -st.reason, "since", since, "producers",
			     st.producers, "consumers", st.consumers,
			     "lag_bytes", (unsigned long long)st.lag_bytes,
			     "daemon", daemon_name(st.daemon));
}

static PyObject *flow_get_last_producer(FlowObject *fo, void *c)
{
	(void)c;
	if (!fo->f)
		return PyLong_FromLong(0);
	return PyLong_FromUnsignedLong(flowshm_last_producer(fo->f));
}

PyDoc_STRVAR(fileno_doc,
"fileno() -> int\n\n"
"Consumer: a descriptor that becomes readable when records may have\n"
"arrived, for event loops (asyncio's loop.add_reader, selectors).  When\n"
"it is readable, read with timeout=0 until BlockingIOError: that\n"
"BlockingIOError arms it again.  It belongs to the flow (do not close\n"
"it); close() ends it.");

static PyObject *flow_fileno(FlowObject *fo, PyObject *unused)
{
	int rc = 0;

	(void)unused;
	if (flow_enter(fo))
		return NULL;
	if (fo->role != FLOWSHM_CONSUMER) {
		flow_leave(fo);
		return raise_rc_msg(-EINVAL, "fileno",
				    "fileno: needs a consumer end");
	}
	if (!fo->set && !(rc = flowshm_set_create(&fo->set)) &&
	    (rc = flowshm_set_add(fo->set, fo->f))) {
		flowshm_set_destroy(fo->set);
		fo->set = NULL;
	}
	if (!rc && (rc = flowshm_set_fd(fo->set)) >= 0)
		rearm(fo);	/* armed from the start */
	flow_leave(fo);
	if (rc < 0)
		return raise_rc(rc, "fileno");
	return PyLong_FromLong(rc);
}

/* ---- Batch: peek_batch's records in place --------------------------------- */

/*
 * The Batch exports one buffer per record: while batch_item makes a view,
 * `cur` says which record a getbuffer is for; at any other time a
 * getbuffer is refused (the records are the items, not the Batch).  Every
 * view holds the Batch; the Batch holds its views only weakly (see
 * "memoryviews, weakly held"), making each when first asked for, and it
 * holds its Flow, whose brecs say where the records lie while it is live.
 */
typedef struct batch_obj {
	PyObject_HEAD
	FlowObject *flow;	/* strong reference */
	PyObject **views;	/* n weakrefs to the views (NULL: none made);
				   NULL once released */
	Py_ssize_t n;		/* records */
	Py_ssize_t exports;	/* buffers handed out and not yet released */
	Py_ssize_t cur;		/* record a getbuffer is for, -1: none */
	int live;		/* not yet released or let go */
} BatchObject;

struct peek_batch_arg { struct flowshm_rec *recs; unsigned max, got; };

static int try_peek_batch(FlowObject *fo, void *arg, int64_t t)
{
	struct peek_batch_arg *a = arg;
	int rc;

	do
		rc = flowshm_peek_batch(fo->f, a->recs, a->max, &a->got, t);
	while (rc == -EAGAIN && t == 0 && rearm(fo));
	return rc;
}

static int batch_getbuffer(BatchObject *b, Py_buffer *view, int flags)
{
	const struct flowshm_rec *r;

	if (!b->live || b->cur < 0) {
		PyErr_SetString(PyExc_BufferError, b->live ?
				"a Batch is no buffer itself: its records "
				"are, as the memoryviews batch[i]" :
				"batch already released");
		return -1;
	}
	r = &b->flow->brecs[b->cur];
	if (PyBuffer_FillInfo(view, (PyObject *)b, (void *)r->data,
			      (Py_ssize_t)r->len, 1, flags))
		return -1;
	b->exports++;
	return 0;
}

static void batch_releasebuffer(BatchObject *b, Py_buffer *view)
{
	(void)view;
	b->exports--;
}

static PyBufferProcs batch_as_buffer = {
	.bf_getbuffer = (getbufferproc)batch_getbuffer,
	.bf_releasebuffer = (releasebufferproc)batch_releasebuffer,
};

/* A Batch over the flow's held records (fo->brecs[0..bn)), or NULL with
 * an exception; the library's batch stays held (pending) either way. */
static BatchObject *batch_new(FlowObject *fo)
{
	BatchObject *b = PyObject_GC_New(BatchObject, &BatchType);

	if (!b)
		return NULL;
	b->flow = (FlowObject *)Py_NewRef(fo);
	b->n = fo->bn;
	b->exports = 0;
	b->live = 1;
	b->cur = -1;
	b->views = PyMem_Calloc(b->n, sizeof(*b->views));
	PyObject_GC_Track(b);
	if (!b->views) {
		Py_DECREF(b);
		return (BatchObject *)PyErr_NoMemory();
	}
	fo->batch = b;
	return b;
}

/* The view of record i: the one made before if it is still alive (a
 * new reference). */
static PyObject *batch_view(BatchObject *b, Py_ssize_t i)
{
	PyObject *v = view_of(b->views[i]);

	if (v)
		return v;
	b->cur = i;
	v = PyMemoryView_FromObject((PyObject *)b);
	b->cur = -1;
	if (v && weak_view(v, &b->views[i]))
		Py_CLEAR(v);
	return v;
}

/* A view still exported (a numpy array made from it, a buffer held by C
 * code)?  Checked before releasing anything, so that a refused release
 * leaves every view of the batch usable. */
static bool view_exported(PyObject *v)
{
	return ((PyMemoryViewObject *)v)->exports > 0;
}

/*
 * Consume the flow's batch, held by the library: its peek_batch, or the
 * one record a peek left there (a Record let go unconsumed: peek_batch
 * cannot run then, and hands out that record as the batch);
 * flowshm_release releases either.  0 or -ESTALE (cut off meanwhile).
 */
static int flow_release_held_batch(FlowObject *fo)
{
	fo->bn = 0;
	return flow_release_peek(fo);
}

static void batch_drop_views(BatchObject *b);

/*
 * Release (consume true) or let go of (consume false: the records stay
 * held by the library, pending, and come again with the next peek_batch,
 * or go to the next consumer if the flow is closed) a live Batch: release
 * every view first, then refuse while anything still holds a buffer of
 * the records (a slice of a view, a numpy array).  0, or -1 with an
 * exception (for a consuming release also ESTALE: cut off meanwhile, the
 * batch is released but what was read may have been overwritten).
 */
static int batch_finish(BatchObject *b, bool consume)
{
	FlowObject *fo = b->flow;
	int rc;

	if (!b->live)
		return 0;
	if (forked(fo->pid))
		return raise_forked();
	if (fo->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"flow in use by another thread");
		return -1;
	}
	for (Py_ssize_t i = 0; i < b->n; i++) {
		PyObject *v = view_of(b->views[i]);
		bool used = v && view_exported(v);

		Py_XDECREF(v);
		if (used) {
			PyErr_Format(PyExc_BufferError,
				     "record %zd of the batch is still in use "
				     "(a numpy array, a buffer): delete it "
				     "first", i);
			return -1;
		}
	}
	for (Py_ssize_t i = 0; i < b->n; i++) {
		if (release_view(b->views[i]))
			return -1;
	}
	if (b->exports) {
		PyErr_Format(PyExc_BufferError,
			     "%zd view(s) of the batch still in use (a slice "
			     "of a record's view?): release them first",
			     b->exports);
		return -1;
	}
	b->live = 0;
	batch_drop_views(b);
	fo->batch = NULL;
	if (!consume || !fo->f || !fo->bn)
		return 0;
	rc = flow_release_held_batch(fo);
	if (rc) {
		raise_rc(rc, "release_batch");
		return -1;
	}
	return 0;
}

PyDoc_STRVAR(peek_batch_doc,
"peek_batch(max=64, timeout=None) -> Batch\n\n"
"Look at up to `max` next records in place, with one synchronisation\n"
"with the producers: a Batch, a sequence of read-only memoryviews, one\n"
"per record, in the ring (numpy.frombuffer(view) is zero copy).  Waits\n"
"(per `timeout`) only for the first record; a batch stops early at the\n"
"end of a lap of the ring, at the end of the stream, or at a record not\n"
"yet committed.  Use as `with f.peek_batch() as views:` (a list of the\n"
"views, released with the batch on exit) or call batch.release() (or\n"
"f.release_batch()).  A released batch releases every one of its\n"
"views: using one afterwards raises ValueError.  While the batch is\n"
"held, other reads of the flow raise RuntimeError, and the producers\n"
"are held back: release promptly.  The records are consumed only by\n"
"the release (or a with block that ends normally); a Batch dropped\n"
"unreleased or left by a with block that raised stays pending: the\n"
"next peek_batch returns the same records again (all of them, whatever\n"
"its max), release_batch() consumes them, close() leaves them to the\n"
"next consumer.  After a Record let go unreleased, the batch is that\n"
"one record.  Errors as recv().");

/* A Record let go unconsumed leaves its record peeked in the library,
 * which refuses peek_batch then: that record is the batch (one record;
 * flow_release_held_batch consumes it).  It is still next: looking again
 * does not wait. */
static int peek_as_batch(FlowObject *fo)
{
	struct peek_arg a;
	int rc = flowshm_peek(fo->f, &a.buf, &a.len, 0);

	if (rc)
		return rc;
	fo->brecs[0] = (struct flowshm_rec){ a.buf, a.len,
					     flowshm_last_producer(fo->f) };
	fo->bn = 1;
	return 0;
}

static PyObject *flow_peek_batch(FlowObject *fo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "max", "timeout", NULL };
	PyObject *tmo = Py_None;
	Py_ssize_t max = 64;
	int64_t t;
	int rc = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|nO:peek_batch", kwlist,
					 &max, &tmo) || timeout_ns_of(tmo, &t))
		return NULL;
	if (max < 1) {
		PyErr_SetString(PyExc_ValueError, "peek_batch: max must be >= 1");
		return NULL;
	}
	if (flow_enter(fo))
		return NULL;
	/* a pending batch (bn without a live Batch) is no refusal */
	if (check_role(fo, FLOWSHM_CONSUMER, "peek_batch") ||
	    ((fo->batch || !fo->bn) && check_not_held(fo, "peek_batch"))) {
		flow_leave(fo);
		return NULL;
	}
	if (!fo->brecs && !(fo->brecs = PyMem_Calloc(BATCH_MAX,
						      sizeof(*fo->brecs)))) {
		flow_leave(fo);
		return PyErr_NoMemory();
	}
	if (fo->bn) {
		/* a pending batch: hand it out again */
	} else if (fo->peeked) {
		rc = peek_as_batch(fo);
	} else {
		struct peek_batch_arg a = { fo->brecs, 0, 0 };

		a.max = max < BATCH_MAX ? (unsigned)max : BATCH_MAX;
		rc = run_waiting(fo, try_peek_batch, &a, t);
		if (!rc)
			fo->bn = a.got;
	}
	flow_leave(fo);
	if (rc == 1)
		return NULL;
	if (rc)
		return raise_rc(rc, "peek_batch");
	return (PyObject *)batch_new(fo);
}

PyDoc_STRVAR(release_batch_doc,
"release_batch()\n\n"
"Release (consume) the flow's batch from peek_batch, live or pending,\n"
"as Batch.release() does.  flowshm.Error (EINVAL) when none is held,\n"
"(ESTALE) when this consumer was cut off (max lag) meanwhile: what was\n"
"read in place may have been overwritten.");

static PyObject *flow_release_batch(FlowObject *fo, PyObject *unused)
{
	int rc;

	(void)unused;
	if (flow_enter(fo))
		return NULL;
	flow_leave(fo);
	if (check_role(fo, FLOWSHM_CONSUMER, "release_batch"))
		return NULL;
	if (fo->batch) {
		if (batch_finish(fo->batch, true))
			return NULL;
		Py_RETURN_NONE;
	}
	if (!fo->bn)
		return raise_rc_msg(-EINVAL, "release_batch",
				    "release_batch: no batch held");
	rc = flow_release_held_batch(fo);
	if (rc)
		return raise_rc(rc, "release_batch");
	Py_RETURN_NONE;
}

static PyObject *batch_release_py(BatchObject *b, PyObject *unused)
{
	(void)unused;
	if (batch_finish(b, true))
		return NULL;
	Py_RETURN_NONE;
}

static int batch_check_live(BatchObject *b)
{
	if (forked(b->flow->pid))	/* brecs may be gone: see "fork" */
		return raise_forked();
	if (b->live)
		return 0;
	PyErr_SetString(PyExc_ValueError, "batch already released");
	return -1;
}

/* A new list of the views of every record. */
static PyObject *batch_list(BatchObject *b)
{
	PyObject *l;

	if (batch_check_live(b))
		return NULL;
	l = PyList_New(b->n);
	for (Py_ssize_t i = 0; l && i < b->n; i++) {
		PyObject *v = batch_view(b, i);

		if (!v) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, i, v);
	}
	return l;
}

/* with: a list of the views (they are released with the batch on exit) */
static PyObject *batch_enter(BatchObject *b, PyObject *unused)
{
	(void)unused;
	return batch_list(b);
}

/* A with block that raised lets the batch go unconsumed (pending). */
static PyObject *batch_exit(BatchObject *b, PyObject *args)
{
	PyObject *exc_type = PyTuple_Size(args) ? PyTuple_GET_ITEM(args, 0)
						: Py_None;

	if (batch_finish(b, exc_type == Py_None))
		return NULL;
	Py_RETURN_NONE;
}

static Py_ssize_t batch_length(BatchObject *b)
{
	return b->live ? b->n : 0;
}

static PyObject *batch_item(BatchObject *b, Py_ssize_t i)
{
	if (batch_check_live(b))
		return NULL;
	if (i < 0 || i >= b->n) {
		PyErr_SetString(PyExc_IndexError, "batch index out of range");
		return NULL;
	}
	return batch_view(b, i);
}

static PyObject *batch_iter(BatchObject *b)
{
	PyObject *l = batch_list(b), *it;

	if (!l)
		return NULL;
	it = PyObject_GetIter(l);
	Py_DECREF(l);
	return it;
}

static PyObject *batch_get_live(BatchObject *b, void *c)
{
	(void)c;
	return PyBool_FromLong(b->live);
}

static PyObject *batch_get_producers(BatchObject *b, void *c)
{
	PyObject *l;

	(void)c;
	if (batch_check_live(b))
		return NULL;
	l = PyList_New(b->flow->bn);
	for (unsigned i = 0; l && i < b->flow->bn; i++) {
		PyObject *p = PyLong_FromUnsignedLong(
			b->flow->brecs[i].producer);

		if (!p) {
			Py_CLEAR(l);
			break;
		}
		PyList_SET_ITEM(l, i, p);
	}
	return l;
}

static int batch_traverse(BatchObject *b, visitproc visit, void *arg)
{
	for (Py_ssize_t i = 0; b->views && i < b->n; i++)
		Py_VISIT(b->views[i]);
	Py_VISIT(b->flow);
	return 0;
}

/* Drop the weakrefs (the views they name live on, released or not).  No
 * tp_clear: a Batch holds no view, so it is in no cycle to break. */
static void batch_drop_views(BatchObject *b)
{
	PyObject **views = b->views;

	b->views = NULL;
	for (Py_ssize_t i = 0; views && i < b->n; i++)
		Py_XDECREF(views[i]);
	PyMem_Free(views);
}

static void batch_dealloc(BatchObject *b)
{
	PyObject_GC_UnTrack(b);
	/* No view is left (each holds a reference to b).  A batch dropped
	 * unreleased was not consumed: it stays pending in the flow. */
	if (b->flow->batch == b)
		b->flow->batch = NULL;
	batch_drop_views(b);
	Py_DECREF(b->flow);
	PyObject_GC_Del(b);
}

static PySequenceMethods batch_as_sequence = {
	.sq_length = (lenfunc)batch_length,
	.sq_item = (ssizeargfunc)batch_item,
};

static PyMethodDef batch_methods[] = {
	{ "release", (PyCFunction)batch_release_py, METH_NOARGS,
	  "release()\n\nRelease every view of the batch (using one "
	  "afterwards raises ValueError) and let the ring reuse the "
	  "records' memory (they are gone from the flow).  BufferError while "
	  "a numpy array or a slice of a view still uses a record; "
	  "flowshm.Error (ESTALE) if cut off meanwhile (max lag).  A no-op "
	  "once released." },
	{ "__enter__", (PyCFunction)batch_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)batch_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef batch_getset[] = {
	{ "live", (getter)batch_get_live, NULL, "False once released", NULL },
	{ "producers", (getter)batch_get_producers, NULL,
	  "who wrote each record (as Flow.last_producer)", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyTypeObject BatchType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "flowshm.Batch",
	.tp_basicsize = sizeof(BatchObject),
	.tp_dealloc = (destructor)batch_dealloc,
	.tp_as_sequence = &batch_as_sequence,
	.tp_as_buffer = &batch_as_buffer,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_traverse = (traverseproc)batch_traverse,
	.tp_iter = (getiterfunc)batch_iter,
	.tp_doc = "The next records, in place in the ring (Flow.peek_batch): "
		  "a sequence of read-only memoryviews, one per record; "
		  "release() or a with block releases them together.",
	.tp_methods = batch_methods,
	.tp_getset = batch_getset,
};
#endif

static PyObject *flow_enter_ctx(FlowObject *fo, PyObject *unused)
{
	(void)unused;
	if (!fo->f) {
		PyErr_SetString(PyExc_ValueError, "I/O operation on closed flow");
		return NULL;
	}
	Py_INCREF(fo);
	return (PyObject *)fo;
}

static PyObject *flow_exit_ctx(FlowObject *fo, PyObject *args)
{
	(void)args;
	return flow_close(fo, NULL);
}

static PyObject *flow_get_closed(FlowObject *fo, void *c)
{
	(void)c;
	return PyBool_FromLong(!fo->f);
}

static PyObject *flow_get_role(FlowObject *fo, void *c)
{
	(void)c;
	return PyUnicode_FromString(fo->role == FLOWSHM_PRODUCER ? "producer"
								  : "consumer");
}

static PyObject *flow_get_name(FlowObject *fo, void *c)
{
	(void)c;
	Py_INCREF(fo->name);
	return fo->name;
}

static PyObject *flow_get_max_record(FlowObject *fo, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLong(fo->max_record);
}

static PyObject *flow_repr(FlowObject *fo)
{
	return PyUnicode_FromFormat("<flowshm.Flow %R %s%s>", fo->name,
				    fo->role == FLOWSHM_PRODUCER ? "producer"
								 : "consumer",
				    fo->f ? "" : " closed");
}

static void flow_dealloc(FlowObject *fo)
{
	if (fo->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)fo);
	/* A held record owns a reference to us: none is left here. */
	flow_close_handle(fo);
	Py_XDECREF(fo->name);
	PyObject_Free(fo);
}

static PyMethodDef flow_methods[] = {
	{ "send", (PyCFunction)(void (*)(void))flow_send,
	  METH_VARARGS | METH_KEYWORDS, send_doc },
	{ "send_batch", (PyCFunction)(void (*)(void))flow_send_batch,
	  METH_VARARGS | METH_KEYWORDS, send_batch_doc },
	{ "reserve", (PyCFunction)(void (*)(void))flow_reserve,
	  METH_VARARGS | METH_KEYWORDS, reserve_doc },
	{ "recv", (PyCFunction)(void (*)(void))flow_recv,
	  METH_VARARGS | METH_KEYWORDS, recv_doc },
	{ "recv_batch", (PyCFunction)(void (*)(void))flow_recv_batch,
	  METH_VARARGS | METH_KEYWORDS, recv_batch_doc },
	{ "peek", (PyCFunction)(void (*)(void))flow_peek,
	  METH_VARARGS | METH_KEYWORDS, peek_doc },
	{ "close", (PyCFunction)flow_close, METH_NOARGS, close_doc },
	{ "shutdown", (PyCFunction)flow_shutdown, METH_NOARGS, shutdown_doc },
	{ "info", (PyCFunction)flow_info, METH_NOARGS, info_doc },
#ifdef FLOWSHM_HAVE_SET_WAIT
	{ "set_wait", (PyCFunction)flow_set_wait, METH_O, set_wait_doc },
#endif
#ifdef FM_HAVE_PIPELINE_API
	{ "end", (PyCFunction)(void (*)(void))flow_end,
	  METH_VARARGS | METH_KEYWORDS, end_doc },
	{ "state", (PyCFunction)flow_state, METH_NOARGS, state_doc },
	{ "fileno", (PyCFunction)flow_fileno, METH_NOARGS, fileno_doc },
	{ "peek_batch", (PyCFunction)(void (*)(void))flow_peek_batch,
	  METH_VARARGS | METH_KEYWORDS, peek_batch_doc },
	{ "release_batch", (PyCFunction)flow_release_batch, METH_NOARGS,
	  release_batch_doc },
#endif
	{ "__enter__", (PyCFunction)flow_enter_ctx, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)flow_exit_ctx, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef flow_getset[] = {
	{ "closed", (getter)flow_get_closed, NULL, "True once closed", NULL },
	{ "role", (getter)flow_get_role, NULL, "'producer' or 'consumer'",
	  NULL },
	{ "name", (getter)flow_get_name, NULL,
	  "the flow's name (None for open_fd)", NULL },
	{ "max_record", (getter)flow_get_max_record, NULL,
	  "the largest record the flow takes, in bytes", NULL },
#ifdef FM_HAVE_PIPELINE_API
	{ "last_producer", (getter)flow_get_last_producer, NULL,
	  "who wrote the record read last: one number per producer handle "
	  "attached at a time (0 before any)", NULL },
#endif
	{ NULL, NULL, NULL, NULL, NULL }
};

PyDoc_STRVAR(flow_doc,
"An open end of a flow: from attach() or open_fd().\n\n"
"A context manager (closes on exit) and, for a consumer, an iterator over\n"
"records (bytes) that ends when the flow is closed and drained.");

static PyTypeObject FlowType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "flowshm.Flow",
	.tp_basicsize = sizeof(FlowObject),
	.tp_dealloc = (destructor)flow_dealloc,
	.tp_repr = (reprfunc)flow_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = flow_doc,
	.tp_weaklistoffset = offsetof(FlowObject, weakrefs),
	.tp_iter = (getiterfunc)flow_iter,
	.tp_iternext = (iternextfunc)flow_next,
	.tp_methods = flow_methods,
	.tp_getset = flow_getset,
};

/* ---- Reservation and Record -------------------------------------------- */

static int rec_getbuffer(RecObject *r, Py_buffer *view, int flags)
{
	int readonly = Py_TYPE(r) == &RecordType;

	if (!r->live) {
		PyErr_SetString(PyExc_BufferError, readonly ?
				"record already released" :
				"reservation already committed");
		return -1;
	}
	if (PyBuffer_FillInfo(view, (PyObject *)r, r->buf, r->len, readonly,
			      flags))
		return -1;
	r->exports++;
	return 0;
}

static void rec_releasebuffer(RecObject *r, Py_buffer *view)
{
	(void)view;
	r->exports--;
}

static PyBufferProcs rec_as_buffer = {
	.bf_getbuffer = (getbufferproc)rec_getbuffer,
	.bf_releasebuffer = (releasebufferproc)rec_releasebuffer,
};

/*
 * Commit (Reservation) or release (Record, consume true) or let go of a
 * Record without consuming it (consume false: it stays next in the flow):
 * first release the memoryview that with/view handed out, then refuse
 * while anything else still holds a buffer of the ring's memory.  Returns
 * 0, or -1 with an exception.
 */
static int rec_finish(RecObject *r, bool consume)
{
	FlowObject *fo = r->flow;
	int reserve = Py_TYPE(r) == &ReservationType;
	int rc = 0;

	if (!r->live)
		return 0;
	if (forked(fo->pid))
		return raise_forked();
	if (fo->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"flow in use by another thread");
		return -1;
	}
	if (release_view(r->view))	/* BufferError: it has exports */
		return -1;
	Py_CLEAR(r->view);
	if (r->exports) {
		PyErr_Format(PyExc_BufferError,
			     "%zd view(s) of the %s still in use: release "
			     "them (or delete the numpy arrays) first",
			     r->exports, reserve ? "reservation" : "record");
		return -1;
	}
	r->live = 0;
	fo->held = NULL;
	r->buf = NULL;
	r->len = 0;
	if (fo->f && reserve)
		rc = flowshm_commit(fo->f);
	else if (fo->f && consume)
		rc = flow_release_peek(fo);
	if (rc) {	/* ESTALE: what was read in place may be torn */
		raise_rc(rc, reserve ? "commit" : "release");
		return -1;
	}
	return 0;
}

static PyObject *rec_finish_py(RecObject *r, PyObject *unused)
{
	(void)unused;
	if (rec_finish(r, true))
		return NULL;
	Py_RETURN_NONE;
}

/* The memoryview `with` hands out (one at a time, released by finish). */
static PyObject *rec_view(RecObject *r, void *c)
{
	PyObject *v;

	(void)c;
	if (!r->live) {
		PyErr_SetString(PyExc_ValueError,
				Py_TYPE(r) == &RecordType ?
				"record already released" :
				"reservation already committed");
		return NULL;
	}
	if ((v = view_of(r->view)))
		return v;
	v = PyMemoryView_FromObject((PyObject *)r);
	if (v && weak_view(v, &r->view))
		Py_CLEAR(v);
	return v;
}

static PyObject *rec_enter(RecObject *r, PyObject *unused)
{
	(void)unused;
	return rec_view(r, NULL);
}

/* A with block that raised leaves its Record in the flow (the stage failed
 * on it: the next peek, or the next consumer, gets it again); a
 * Reservation is committed either way (see reserve_doc). */
static PyObject *rec_exit(RecObject *r, PyObject *args)
{
	PyObject *exc_type = PyTuple_Size(args) ? PyTuple_GET_ITEM(args, 0)
						: Py_None;

	if (rec_finish(r, exc_type == Py_None))
		return NULL;
	Py_RETURN_NONE;
}

static Py_ssize_t rec_length(RecObject *r)
{
	return r->len;
}

static PyObject *rec_get_live(RecObject *r, void *c)
{
	(void)c;
	return PyBool_FromLong(r->live);
}

static int rec_traverse(RecObject *r, visitproc visit, void *arg)
{
	Py_VISIT(r->view);
	Py_VISIT(r->flow);
	return 0;
}

static int rec_clear(RecObject *r)
{
	Py_CLEAR(r->view);
	return 0;
}

static void rec_dealloc(RecObject *r)
{
	PyObject_GC_UnTrack(r);
	/* No view is left (each holds a reference to r).  A forgotten
	 * reservation is published (a claim must not stay open; in a child
	 * of fork the claim is the parent's); a forgotten record was not
	 * consumed: it stays next in the flow. */
	if (r->live && r->flow->f && Py_TYPE(r) == &ReservationType &&
	    !forked(r->flow->pid))
		(void)flowshm_commit(r->flow->f);	/* ours: cannot fail */
	if (r->flow->held == r)
		r->flow->held = NULL;
	Py_XDECREF(r->view);
	Py_DECREF(r->flow);
	PyObject_GC_Del(r);
}

static PySequenceMethods rec_as_sequence = {
	.sq_length = (lenfunc)rec_length,
};

static PyMethodDef reservation_methods[] = {
	{ "commit", (PyCFunction)rec_finish_py, METH_NOARGS,
	  "commit()\n\nPublish the record.  BufferError while a view of it "
	  "is in use; a no-op once committed." },
	{ "__enter__", (PyCFunction)rec_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)rec_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL }
};

static PyMethodDef record_methods[] = {
	{ "release", (PyCFunction)rec_finish_py, METH_NOARGS,
	  "release()\n\nLet the ring reuse the record's memory (it is gone "
	  "from the flow).  BufferError while a view of it is in use; "
	  "flowshm.Error (ESTALE) if cut off meanwhile (max lag); a no-op "
	  "once released." },
	{ "__enter__", (PyCFunction)rec_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)rec_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef reservation_getset[] = {
	{ "view", (getter)rec_view, NULL,
	  "a writable memoryview of the reserved bytes", NULL },
	{ "live", (getter)rec_get_live, NULL, "False once committed", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyGetSetDef record_getset[] = {
	{ "view", (getter)rec_view, NULL,
	  "a read-only memoryview of the record", NULL },
	{ "live", (getter)rec_get_live, NULL, "False once released", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyTypeObject ReservationType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "flowshm.Reservation",
	.tp_basicsize = sizeof(RecObject),
	.tp_dealloc = (destructor)rec_dealloc,
	.tp_as_sequence = &rec_as_sequence,
	.tp_as_buffer = &rec_as_buffer,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_traverse = (traverseproc)rec_traverse,
	.tp_clear = (inquiry)rec_clear,
	.tp_doc = "Room claimed in the ring for one record (Flow.reserve): a "
		  "writable bytes-like object; commit() or a with block "
		  "publishes it.",
	.tp_methods = reservation_methods,
	.tp_getset = reservation_getset,
};

static PyTypeObject RecordType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "flowshm.Record",
	.tp_basicsize = sizeof(RecObject),
	.tp_dealloc = (destructor)rec_dealloc,
	.tp_as_sequence = &rec_as_sequence,
	.tp_as_buffer = &rec_as_buffer,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_traverse = (traverseproc)rec_traverse,
	.tp_clear = (inquiry)rec_clear,
	.tp_doc = "The next record, in place in the ring (Flow.peek): a "
		  "read-only bytes-like object; release() or a with block "
		  "lets it go.",
	.tp_methods = record_methods,
	.tp_getset = record_getset,
};

/* ---- module ------------------------------------------------------------ */

#ifdef FM_HAVE_PIPELINE_API
struct poll_arg {
	flowshm_t **f;
	unsigned n, *ready, nready;
};

static int try_poll(FlowObject *fo, void *arg, int64_t t)
{
	struct poll_arg *a = arg;

	(void)fo;
	return flowshm_poll(a->f, a->n, a->ready, &a->nready, t);
}

PyDoc_STRVAR(poll_doc,
"poll(flows, timeout=None) -> list[Flow]\n\n"
"Wait until at least one of the consumer Flows has something to read (a\n"
"record, or an end: EndOfStream, BrokenPipeError) and return every such\n"
"flow, starting at one that moves on by one each call, so that serving\n"
"only the first still serves every busy flow in turn.  One system call\n"
"for any number of flows.  BlockingIOError (timeout 0) or TimeoutError\n"
"when none is ready.  Remove a flow that ended: it stays ready.");

static PyObject *py_poll(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "flows", "timeout", NULL };
	PyObject *flows, *seq, *tmo = Py_None, *ret = NULL;
	struct poll_arg a = { 0 };
	Py_ssize_t n, taken = 0;
	int64_t t;
	int rc;

	(void)self;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:poll", kwlist, &flows,
					 &tmo) || timeout_ns_of(tmo, &t))
		return NULL;
	/* a snapshot: the GIL is released while we use the flows */
	seq = seq_snapshot(flows, "poll: flows must be a sequence");
	if (!seq)
		return NULL;
	n = PyTuple_GET_SIZE(seq);
	if (n < 1 || n > FLOWSHM_POLL_MAX) {
		PyErr_Format(PyExc_ValueError, "poll: 1 to %u flows",
			     FLOWSHM_POLL_MAX);
		goto out;
	}
	a.f = PyMem_Calloc(n, sizeof(*a.f));
	a.ready = PyMem_Calloc(n, sizeof(*a.ready));
	if (!a.f || !a.ready) {
		PyErr_NoMemory();
		goto out;
	}
	a.n = (unsigned)n;
	/* every flow is taken (busy) for the wait: none may close meanwhile */
	for (; taken < n; taken++) {
		PyObject *o = PyTuple_GET_ITEM(seq, taken);
		FlowObject *fo = (FlowObject *)o;

		if (!PyObject_TypeCheck(o, &FlowType)) {
			PyErr_SetString(PyExc_TypeError,
					"poll: flows must be Flow objects");
			goto out;
		}
		if (flow_begin(fo, FLOWSHM_CONSUMER, "poll"))
			goto out;
		a.f[taken] = fo->f;
	}
	rc = run_waiting((FlowObject *)PyTuple_GET_ITEM(seq, 0),
			 try_poll, &a, t);
	if (rc == 1)
		goto out;
	if (rc) {
		raise_rc(rc, "poll");
		goto out;
	}
	ret = PyList_New(a.nready);
	for (unsigned i = 0; ret && i < a.nready; i++) {
		PyObject *o = PyTuple_GET_ITEM(seq, a.ready[i]);

		PyList_SET_ITEM(ret, i, Py_NewRef(o));
	}
out:
	for (Py_ssize_t i = 0; i < taken; i++)
		flow_leave((FlowObject *)PyTuple_GET_ITEM(seq, i));
	PyMem_Free(a.f);
	PyMem_Free(a.ready);
	Py_DECREF(seq);
	return ret;
}

/* ---- Set: consumer flows waited on together -------------------------------- */

/*
 * A flowshm_set and the Flows in it (the list holds them, so none can be
 * deallocated while in the set).  Each Flow knows its Sets (borrowed
 * pointers): closing a Flow removes it from every Set first, because the
 * library's set must never hold a handle that is gone (its helper thread
 * may be counted on the ring).  `busy` is the set's one-thread rule, as
 * a Flow's: flowshm_set_poll holds the set's mutex while it waits.
 */
typedef struct set_obj {
	PyObject_HEAD
	flowshm_set_t *s;	/* NULL once closed (or closing) */
	pid_t pid;		/* the process that made it (fork) */
	PyObject *flows;	/* list of Flow, in the order added */
	int busy;
} SetObject;

static int flow_join_set(FlowObject *fo, SetObject *so)
{
	SetObject **sets = PyMem_Realloc(fo->sets,
					 (fo->nsets + 1) * sizeof(*sets));

	if (!sets) {
		PyErr_NoMemory();
		return -1;
	}
	sets[fo->nsets++] = so;
	fo->sets = sets;
	return 0;
}

static void flow_forget_set(FlowObject *fo, SetObject *so)
{
	for (Py_ssize_t i = 0; i < fo->nsets; i++) {
		if (fo->sets[i] == so) {
			fo->sets[i] = fo->sets[--fo->nsets];
			break;
		}
	}
	if (!fo->nsets) {
		PyMem_Free(fo->sets);
		fo->sets = NULL;
	}
}

static Py_ssize_t set_index(SetObject *so, PyObject *o)
{
	for (Py_ssize_t i = 0; i < PyList_GET_SIZE(so->flows); i++) {
		if (PyList_GET_ITEM(so->flows, i) == o)
			return i;
	}
	return -1;
}

/* Take flow i out of the set (library first: the handle may go next). */
static void set_drop(SetObject *so, Py_ssize_t i)
{
	FlowObject *fo = (FlowObject *)PyList_GET_ITEM(so->flows, i);

	if (so->s && fo->f && !forked(so->pid))
		flowshm_set_remove(so->s, fo->f);
	flow_forget_set(fo, so);
	PySequence_DelItem(so->flows, i);	/* drops the set's reference */
}

/* Flow.close(): out of every Set it is in. */
static void flow_leave_sets(FlowObject *fo)
{
	if (!fo->nsets)	/* always so in flow_dealloc: the sets hold fo */
		return;
	Py_INCREF(fo);	/* the sets' references may be the last ones */
	while (fo->nsets) {
		SetObject *so = fo->sets[fo->nsets - 1];
		Py_ssize_t i = set_index(so, (PyObject *)fo);

		if (i >= 0)
			set_drop(so, i);
		else
			flow_forget_set(fo, so);
	}
	Py_DECREF(fo);
}

static int set_check(SetObject *so)
{
	if (forked(so->pid))
		return raise_forked();
	if (!so->s) {
		PyErr_SetString(PyExc_ValueError, "operation on closed set");
		return -1;
	}
	if (so->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"set in use by another thread: a set belongs "
				"to one thread at a time");
		return -1;
	}
	return 0;
}

static PyObject *set_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	SetObject *so;
	int rc;

	if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
		PyErr_SetString(PyExc_TypeError, "Set() takes no arguments");
		return NULL;
	}
	so = (SetObject *)type->tp_alloc(type, 0);
	if (!so)
		return NULL;
	so->pid = cur_pid;
	so->busy = 0;
	so->flows = PyList_New(0);
	if (!so->flows) {
		Py_DECREF(so);
		return NULL;
	}
	rc = flowshm_set_create(&so->s);
	if (rc) {
		so->s = NULL;
		Py_DECREF(so);
		return raise_rc(rc, "Set");
	}
	return (PyObject *)so;
}

/*
 * The flows go first, with the GIL held (flowshm_set_remove calls the
 * helper back): no handle is left in the set once another thread can run
 * and close one.  Dropping a flow may run code (a weakref callback) and
 * let another thread close the set meanwhile, so so->s is read after, and
 * cleared before the GIL is released for the destroy: a second close (or
 * add, poll) finds the set closed, not one being destroyed.  In a child of
 * fork the set is the parent's (see "fork"): left alone.
 */
static void set_close_all(SetObject *so)
{
	flowshm_set_t *s;

	while (so->flows && PyList_GET_SIZE(so->flows))
		set_drop(so, PyList_GET_SIZE(so->flows) - 1);
	s = so->s;
	so->s = NULL;
	if (!s || forked(so->pid))
		return;
	/* joins its helper thread: quick, it is called back */
	Py_BEGIN_ALLOW_THREADS
	flowshm_set_destroy(s);
	Py_END_ALLOW_THREADS
}

PyDoc_STRVAR(set_close_doc,
"close()\n\n"
"Destroy the set (its descriptor is closed) and let go of its flows (they\n"
"stay open).  Idempotent.");

static PyObject *set_close(SetObject *so, PyObject *unused)
{
	(void)unused;
	if (so->busy && !forked(so->pid)) {
		PyErr_SetString(PyExc_RuntimeError,
				"close: set in use by another thread");
		return NULL;
	}
	set_close_all(so);
	Py_RETURN_NONE;
}

PyDoc_STRVAR(set_add_doc,
"add(flow)\n\n"
"Add an open consumer Flow (the set holds it until removed, the set is\n"
"closed, or the flow is closed: closing a flow takes it out of every\n"
"set).  flowshm.Error: EINVAL (a producer), EEXIST (already in),\n"
"ENOSPC (SET_MAX flows already); ValueError for a closed flow.");

static PyObject *set_add(SetObject *so, PyObject *o)
{
	FlowObject *fo = (FlowObject *)o;
	int rc;

	if (set_check(so))
		return NULL;
	if (!PyObject_TypeCheck(o, &FlowType)) {
		PyErr_SetString(PyExc_TypeError, "add: a Flow");
		return NULL;
	}
	if (forked(fo->pid)) {
		raise_forked();
		return NULL;
	}
	if (!fo->f) {
		PyErr_SetString(PyExc_ValueError, "I/O operation on closed flow");
		return NULL;
	}
	rc = flowshm_set_add(so->s, fo->f);
	if (rc == -EEXIST)
		return raise_rc_msg(rc, "add", "add: the flow is already in "
				    "the set");
	if (rc == -EINVAL)
		return raise_rc_msg(rc, "add", "add: needs a consumer end");
	if (rc)
		return raise_rc(rc, "add");
	if (PyList_Append(so->flows, o) || flow_join_set(fo, so)) {
		Py_ssize_t i = set_index(so, o);

		flowshm_set_remove(so->s, fo->f);
		if (i >= 0)
			PySequence_DelItem(so->flows, i);
		return NULL;
	}
	Py_RETURN_NONE;
}

PyDoc_STRVAR(set_remove_doc,
"remove(flow)\n\n"
"Take a flow out of the set (it stays open).  KeyError if it is not in\n"
"the set (a closed flow no longer is).");

static PyObject *set_remove(SetObject *so, PyObject *o)
{
	Py_ssize_t i;

	if (set_check(so))
		return NULL;
	i = set_index(so, o);
	if (i < 0) {
		PyErr_SetObject(PyExc_KeyError, o);
		return NULL;
	}
	set_drop(so, i);
	Py_RETURN_NONE;
}

struct set_poll_arg {
	flowshm_set_t *s;
	flowshm_t *ready[FLOWSHM_SET_MAX];
	unsigned max, nready;
};

static int try_set_poll(FlowObject *unused, void *arg, int64_t t)
{
	struct set_poll_arg *a = arg;

	(void)unused;
	return flowshm_set_poll(a->s, a->ready, a->max, &a->nready, t);
}

PyDoc_STRVAR(set_poll_doc,
"poll(timeout=None, max=None) -> list[Flow]\n\n"
"Wait (GIL released) until at least one flow of the set has something\n"
"to read (a record, or an end: EndOfStream, BrokenPipeError, or a batch\n"
"left pending) and return up to `max` (None: all) such flows, starting\n"
"at one that moves on by one each call, so that serving only the first\n"
"still serves every busy flow in turn: a flooded flow cannot starve the\n"
"others.  BlockingIOError (timeout 0) or TimeoutError when none is\n"
"ready; flowshm.Error (EINVAL) for an empty set.  Remove a flow that\n"
"ended: it stays ready.  Every flow of the set is in use during the\n"
"call (another thread's call on one raises RuntimeError).\n"
"With fileno(): once the descriptor is readable, poll(timeout=0) and\n"
"serve until BlockingIOError, which arms the descriptor again.");

static PyObject *set_poll(SetObject *so, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "timeout", "max", NULL };
	PyObject *tmo = Py_None, *omax = Py_None, *ret = NULL;
	struct set_poll_arg a = { 0 };
	Py_ssize_t n, taken = 0, max = FLOWSHM_SET_MAX;
	int64_t t;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:poll", kwlist, &tmo,
					 &omax) || timeout_ns_of(tmo, &t))
		return NULL;
	if (omax != Py_None &&
	    ((max = PyLong_AsSsize_t(omax)) == -1 && PyErr_Occurred()))
		return NULL;
	if (max < 1) {
		PyErr_SetString(PyExc_ValueError, "poll: max must be >= 1");
		return NULL;
	}
	if (set_check(so))
		return NULL;
	n = PyList_GET_SIZE(so->flows);
	if (n == 0)
		return raise_rc_msg(-EINVAL, "poll", "poll: the set is empty");
	so->busy = 1;
	/* every flow is taken (busy) for the wait: the library's scan reads
	 * their handles, and none may close meanwhile */
	for (; taken < n; taken++) {
		if (flow_enter((FlowObject *)PyList_GET_ITEM(so->flows, taken)))
			goto out;
	}
	a.s = so->s;
	a.max = max < FLOWSHM_SET_MAX ? (unsigned)max : FLOWSHM_SET_MAX;
	rc = run_waiting(NULL, try_set_poll, &a, t);
	if (rc == 1)
		goto out;
	if (rc) {
		raise_rc(rc, "poll");
		goto out;
	}
	ret = PyList_New(a.nready);
	for (unsigned i = 0; ret && i < a.nready; i++) {
		for (Py_ssize_t j = 0; j < n; j++) {
			FlowObject *fo = (FlowObject *)
				PyList_GET_ITEM(so->flows, j);

			if (fo->f == a.ready[i]) {
				PyList_SET_ITEM(ret, i, Py_NewRef(fo));
				break;
			}
		}
	}
out:
	for (Py_ssize_t i = 0; i < taken; i++)
		flow_leave((FlowObject *)PyList_GET_ITEM(so->flows, i));
	so->busy = 0;
	return ret;
}

PyDoc_STRVAR(set_fileno_doc,
"fileno() -> int\n\n"
"A descriptor (an eventfd; the set owns it: do not close it) that\n"
"becomes readable when a flow of the set may have data, for event loops\n"
"(asyncio's loop.add_reader, selectors, epoll).  Edge semantics: when\n"
"it is readable, call poll(timeout=0) and serve, again and again until\n"
"it raises BlockingIOError; that arms the descriptor again.  It may be\n"
"readable with nothing ready (poll, get BlockingIOError, wait again).\n"
"flowshm.Error (ENOSYS) on a kernel without futex_waitv (Linux < 5.16).");

static PyObject *set_fileno(SetObject *so, PyObject *unused)
{
	int rc;

	(void)unused;
	if (set_check(so))
		return NULL;
	rc = flowshm_set_fd(so->s);
	if (rc < 0)
		return raise_rc(rc, "fileno");
	return PyLong_FromLong(rc);
}

static PyObject *set_enter_ctx(SetObject *so, PyObject *unused)
{
	(void)unused;
	if (!so->s) {
		PyErr_SetString(PyExc_ValueError, "operation on closed set");
		return NULL;
	}
	return Py_NewRef(so);
}

static PyObject *set_exit_ctx(SetObject *so, PyObject *args)
{
	(void)args;
	return set_close(so, NULL);
}

static Py_ssize_t set_length(SetObject *so)
{
	return PyList_GET_SIZE(so->flows);
}

static int set_contains(SetObject *so, PyObject *o)
{
	return set_index(so, o) >= 0;
}

static PyObject *set_get_flows(SetObject *so, void *c)
{
	(void)c;
	return PyList_AsTuple(so->flows);
}

static PyObject *set_get_closed(SetObject *so, void *c)
{
	(void)c;
	return PyBool_FromLong(!so->s);
}

static PyObject *set_repr(SetObject *so)
{
	return PyUnicode_FromFormat("<flowshm.Set of %zd flow(s)%s>",
				    PyList_GET_SIZE(so->flows),
				    so->s ? "" : " closed");
}

static void set_dealloc(SetObject *so)
{
	set_close_all(so);
	Py_XDECREF(so->flows);
	Py_TYPE(so)->tp_free((PyObject *)so);
}

static PySequenceMethods set_as_sequence = {
	.sq_length = (lenfunc)set_length,
	.sq_contains = (objobjproc)set_contains,
};

static PyMethodDef set_methods[] = {
	{ "add", (PyCFunction)set_add, METH_O, set_add_doc },
	{ "remove", (PyCFunction)set_remove, METH_O, set_remove_doc },
	{ "poll", (PyCFunction)(void (*)(void))set_poll,
	  METH_VARARGS | METH_KEYWORDS, set_poll_doc },
	{ "fileno", (PyCFunction)set_fileno, METH_NOARGS, set_fileno_doc },
	{ "close", (PyCFunction)set_close, METH_NOARGS, set_close_doc },
	{ "__enter__", (PyCFunction)set_enter_ctx, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)set_exit_ctx, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL }
};

static PyGetSetDef set_getset[] = {
	{ "flows", (getter)set_get_flows, NULL,
	  "the flows in the set, in the order added (a tuple)", NULL },
	{ "closed", (getter)set_get_closed, NULL, "True once closed", NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

PyDoc_STRVAR(set_doc,
"Set() -> Set\n\n"
"Consumer Flows waited on together (flowshm_set): poll() returns the\n"
"ready ones, fairly, sleeping in one system call however many flows;\n"
"fileno() is a descriptor for event loops.  At most SET_MAX (127) flows.\n"
"A context manager (closes on exit).  The set holds its flows; closing\n"
"a flow takes it out of every set.  One thread at a time.");

static PyTypeObject SetType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "flowshm.Set",
	.tp_basicsize = sizeof(SetObject),
	.tp_dealloc = (destructor)set_dealloc,
	.tp_repr = (reprfunc)set_repr,
	.tp_as_sequence = &set_as_sequence,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = set_doc,
	.tp_methods = set_methods,
	.tp_getset = set_getset,
	.tp_new = set_new,
};
#endif

static PyMethodDef module_methods[] = {
	{ "attach", (PyCFunction)(void (*)(void))py_attach,
	  METH_VARARGS | METH_KEYWORDS, attach_doc },
	{ "open_fd", (PyCFunction)(void (*)(void))py_open_fd,
	  METH_VARARGS | METH_KEYWORDS, open_fd_doc },
	{ "ring_create", (PyCFunction)(void (*)(void))py_ring_create,
	  METH_VARARGS | METH_KEYWORDS, ring_create_doc },
	{ "strerror", (PyCFunction)py_strerror, METH_O, strerror_doc },
#ifdef FM_HAVE_PIPELINE_API
	{ "poll", (PyCFunction)(void (*)(void))py_poll,
	  METH_VARARGS | METH_KEYWORDS, poll_doc },
#endif
	{ NULL, NULL, 0, NULL }
};

PyDoc_STRVAR(module_doc,
"flowmover's client library (libflowshm) for Python.\n\n"
"    with flowshm.attach('frames', 'consumer') as f:\n"
"        for rec in f:              # bytes, until the flow is closed\n"
"            ...\n"
"        with f.peek() as view:     # zero copy, read-only memoryview\n"
"            a = numpy.frombuffer(view, dtype=numpy.float32)\n"
"            ...; del a             # views must go before the release\n\n"
"Errors are OSError subclasses carrying errno: BlockingIOError (EAGAIN),\n"
"TimeoutError, BrokenPipeError (EPIPE: flow closed), PermissionError,\n"
"FileNotFoundError (no such flow), flowshm.Error for the others.");

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "flowshm",
	.m_doc = module_doc,
	.m_size = -1,
	.m_methods = module_methods,
};

/* See "fork"; once per process (a second init, in a subinterpreter,
 * must not add a second handler). */
static int fork_init(void)
{
	static bool done;
	int rc;

	if (done)
		return 0;
	cur_pid = getpid();
	rc = pthread_atfork(NULL, NULL, after_fork_child);
	if (rc) {
		errno = rc;
		PyErr_SetFromErrno(PyExc_OSError);
		return -1;
	}
	done = true;
	return 0;
}

PyMODINIT_FUNC PyInit_flowshm(void)
{
	PyObject *m;

	if (fork_init() || PyType_Ready(&FlowType) ||
	    PyType_Ready(&ReservationType) || PyType_Ready(&RecordType))
		return NULL;
#ifdef FM_HAVE_PIPELINE_API
	if (PyType_Ready(&BatchType) || PyType_Ready(&SetType))
		return NULL;
#endif
	m = PyModule_Create(&module_def);
	if (!m)
		return NULL;
	flowshm_error = PyErr_NewExceptionWithDoc(
		"flowshm.Error",
		"A flowshm error without a builtin OSError subclass of its "
		"own; errno and strerror say which.",
		PyExc_OSError, NULL);
	if (!flowshm_error ||
	    PyModule_AddObjectRef(m, "Error", flowshm_error) ||
#ifdef FM_HAVE_PIPELINE_API
	    !(end_of_stream = PyErr_NewExceptionWithDoc(
		"flowshm.EndOfStream",
		"End of stream (ENODATA): every record of the flow was "
		"delivered and its producers ended it.  Not an error of the "
		"flow; iteration stops there.", flowshm_error, NULL)) ||
	    PyModule_AddObjectRef(m, "EndOfStream", end_of_stream) ||
	    PyModule_AddObjectRef(m, "Batch", (PyObject *)&BatchType) ||
	    PyModule_AddObjectRef(m, "Set", (PyObject *)&SetType) ||
	    PyModule_AddIntConstant(m, "SET_MAX", FLOWSHM_SET_MAX) ||
#endif
	    PyModule_AddObjectRef(m, "Flow", (PyObject *)&FlowType) ||
	    PyModule_AddObjectRef(m, "Reservation",
				  (PyObject *)&ReservationType) ||
	    PyModule_AddObjectRef(m, "Record", (PyObject *)&RecordType) ||
	    PyModule_AddStringConstant(m, "__version__", FLOWSHM_VERSION)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
