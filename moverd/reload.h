/*
 * moverd/reload.h - a reload (moverctl reload, SIGHUP) without blocking the
 * io_uring loop.
 *
 * Reading the config can block: a user or group name in allow-uid= or in
 * an option line asks NSS (sssd, LDAP), which may wait seconds on a server
 * that does not answer, and every flow of the host would wait with the
 * loop.  So each reload runs in two halves (declared.h): the reading on a
 * thread of its own, which reports through an eventfd the loop reads; the
 * applying on the loop.
 *
 * One reload runs at a time.  A request while one runs is served by the
 * next run, which starts when this one ends and reads the file as it is
 * then (requests in the meantime share it).  Each request is known by the
 * number of the run that answers it (reload_ask), each run's result by its
 * number (done).
 *
 * At the stop a run still reading is left to its thread, which frees what
 * it shares with the loop when it is done (the process may exit first);
 * it reads nothing the stop frees (declared_reload_read).
 */
#ifndef MOVERD_RELOAD_H
#define MOVERD_RELOAD_H

#include "declared.h"
#include "loop.h"

#include <stdbool.h>
#include <stdint.h>

struct reload_run;

/*
 * A run ended (on the loop): its number, its result (rc 0 applied, or a
 * negative errno with why in rd->err) and report (rd->r).  rd is the
 * run's: read it now, it is gone after.
 */
typedef void (*reload_done_fn)(void *arg, uint64_t run,
			       const struct declared_reading *rd);

struct reloader {
	struct loop *loop;
	struct declared *declared;
	reload_done_fn done;        /* control.c: answers who asked */
	void *done_arg;
	void (*notice)(void *arg, bool begin); /* systemd hears (NULL: no) */
	void *notice_arg;
	struct loop_op op;          /* the read of the running run's eventfd */
	uint64_t count;             /* its buffer */
	uint64_t started;           /* runs started (the running one's number) */
	bool again;                 /* asked while one ran: run again after */
	bool stopped;
	struct reload_run *run;     /* the one running (NULL: none) */
};

/* Set up (nothing runs yet). */
void reload_init(struct reloader *rl, struct loop *l, struct declared *d);

/*
 * Ask for a reload: one starts now, or after the one running.  The number
 * of the run that will answer, or 0 with why in err (no thread or eventfd
 * could be had; moverd is stopping).
 */
uint64_t reload_ask(struct reloader *rl, char *err, size_t cap);

/* The read of the eventfd, if an arm found no SQE (every loop pass). */
void reload_rearm(struct reloader *rl);

/* Is a run under way (the stop does not wait for it)? */
bool reload_busy(const struct reloader *rl);

/* No more runs; one still reading is left to its thread.  Requests that
 * waited for it (or the next) are answered -ECANCELED. */
void reload_stop(struct reloader *rl);

#endif
