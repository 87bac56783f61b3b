/*
 * ipc/lattrace.h - a timestamp trail for one record's way through the
 * processes of a host (issue 12: where the latency goes).
 *
 * Off unless the environment has FM_LATTRACE=DIR when fmlt_init runs: then
 * every fmlt_mark appends (CLOCK_MONOTONIC ns, event, argument) to an array
 * of LT_MAX entries allocated once (the rest are dropped), and fmlt_dump
 * writes it to DIR/WHO.PID, one "ns event who arg" line per mark.  All the
 * processes of a run share the clock, so contrib/lattrace.py merges the
 * files of moverd A, moverd B and flowbench's clients into a hop table.
 * When off, fmlt_mark costs one load and one branch.
 */
#ifndef FLOWMOVER_IPC_LATTRACE_H
#define FLOWMOVER_IPC_LATTRACE_H

#include <stdint.h>

#define LT_MAX (1u << 20)

enum lt_event {
	LT_SLEEP = 1,       /* moverd: the loop blocks (idle strategy: sleep) */
	LT_WAKE = 2,        /* moverd: ... and returns */
	LT_BELL = 3,        /* moverd: doorbell bits collected (arg: how many) */
	LT_TX_SUBMIT = 4,   /* moverd: a send prepared (arg: iovs) */
	LT_TX_DONE = 5,     /* moverd: its completion reaped */
	LT_PUBLISH = 7,     /* moverd: a deposit published (arg: position) */
	LT_RX_HDR = 9,      /* moverd: a receive between bodies completed
			     * (arg: bytes; over TCP a header and what came
			     * behind it, a small body or more frames) */
	LT_RX_BODY = 10,    /* moverd: a receive of the rest of a body */
	LT_WORK = 11,       /* moverd: a duty cycle that found work */
	LT_PING_SEND = 20,  /* flowbench pinger: before its send */
	LT_PING_SENT = 21,  /* ... the send returned */
	LT_PING_GOT = 22,   /* ... the echo received */
	LT_ECHO_GOT = 30,   /* flowbench echo: a ping received */
	LT_ECHO_SENT = 31,  /* ... echoed */
	LT_BELL_WAKE = 40,  /* a producer: FUTEX_WAKE of a sleeping moverd */
	LT_CONS_WAKE = 41,  /* FUTEX_WAKE of a sleeping consumer */
	LT_CONS_SLEEP = 42, /* a consumer: FUTEX_WAIT for data */
	LT_CONS_WOKE = 43,  /* ... returned */
	LT_SEND = 50,       /* flowbench paced/sparse producer: before a send */
	LT_GOT = 52,        /* flowbench consumer: a timestamped record read */
};

extern int fmlt_on;

void fmlt_mark_(enum lt_event ev, uint64_t arg);

static inline void fmlt_mark(enum lt_event ev, uint64_t arg)
{
	if (fmlt_on)
		fmlt_mark_(ev, arg);
}

/* Start the trail if FM_LATTRACE is set; who names the dump file. */
void fmlt_init(const char *who);

/* Write the trail (nothing when off); a process calls it before it exits. */
void fmlt_dump(void);

#endif
