/*
 * moverd/notify.h - telling systemd how moverd is (sd_notify(3), for a
 * Type=notify unit): READY=1 once the control socket listens and the
 * declared flows exist, RELOADING=1 .. READY=1 around a reload,
 * STOPPING=1 at shutdown, and WATCHDOG=1 from the event loop while the
 * unit has WatchdogSec= (WATCHDOG_USEC): a loop that stops turning stops
 * the pings, and systemd restarts moverd.  Without NOTIFY_SOCKET (not
 * under systemd) every call is a no-op.
 */
#ifndef MOVERD_NOTIFY_H
#define MOVERD_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Read WATCHDOG_USEC; log what was found. */
void notify_init(void);

void notify_ready(void);
void notify_reloading(bool begin);   /* begin: RELOADING=1; end: READY=1 */
void notify_stopping(void);

/* From every turn of the event loop: a ping when half the watchdog
 * interval has passed since the last one (now: fr_now_ns()). */
void notify_tick(uint64_t now_ns);
/* ms until the next ping is due (-1: no watchdog): the loop, which has no
 * period, sleeps no longer. */
int notify_due_ms(uint64_t now_ns);

#endif
