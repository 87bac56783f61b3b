/*
 * moverd/notify.c - sd_notify(3) through libsystemd.  See notify.h.
 *
 * sd_notify sends one datagram on a fresh socket to NOTIFY_SOCKET; the
 * watchdog ping costs that once every WATCHDOG_USEC / 2, nothing per
 * cycle but a comparison.
 */
#include "notify.h"
#include "log.h"

#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

static uint64_t watchdog_ns;   /* half WATCHDOG_USEC; 0: no watchdog */
static uint64_t last_ping_ns;

static void send_state(const char *state)
{
	int rc = sd_notify(0, state);

	if (rc < 0)
		log_warn("sd_notify %s: %s", state, strerror(-rc));
}

void notify_init(void)
{
	uint64_t usec = 0;

	/* 0: keep the variables, so a re-exec'd moverd still sees them */
	if (sd_watchdog_enabled(0, &usec) > 0 && usec) {
		watchdog_ns = usec * 1000 / 2;
		log_info("systemd watchdog: %llu ms; pinging every %llu ms",
			 (unsigned long long)(usec / 1000),
			 (unsigned long long)(watchdog_ns / 1000000));
	}
}

void notify_ready(void)
{
	char state[64];

	snprintf(state, sizeof(state), "READY=1\nMAINPID=%d", (int)getpid());
	send_state(state);
}

void notify_reloading(bool begin)
{
	send_state(begin ? "RELOADING=1" : "READY=1");
}

void notify_stopping(void)
{
	send_state("STOPPING=1");
}

void notify_tick(uint64_t now_ns)
{
	if (!watchdog_ns || now_ns - last_ping_ns < watchdog_ns)
		return;
	last_ping_ns = now_ns;
	send_state("WATCHDOG=1");
}

int notify_due_ms(uint64_t now_ns)
{
	uint64_t due = last_ping_ns + watchdog_ns;

	if (!watchdog_ns)
		return -1;
	return due <= now_ns ? 1 : (int)((due - now_ns + 999999) / 1000000);
}
