/*
 * moverd/log.c - one line per event: "LEVEL message" on stderr with a
 * timestamp, or syslog(3) with the matching priority.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

static enum log_level max_level = LOG_LVL_INFO;
static int to_syslog;

static const char *const names[] = { "error", "warn", "info", "debug" };
static const int priorities[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };

void log_setup(enum log_level level, int use_syslog)
{
	max_level = level;
	to_syslog = use_syslog;
	if (use_syslog)
		openlog("moverd", LOG_PID | LOG_NDELAY, LOG_DAEMON);
}

int log_parse_level(const char *name, enum log_level *out)
{
	for (int i = 0; i <= LOG_LVL_DEBUG; i++) {
		if (strcmp(name, names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	char line[1024], stamp[32];
	struct timespec ts;
	struct tm tm;
	va_list ap;

	if (level > max_level)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (to_syslog) {
		syslog(priorities[level], "%s", line);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	localtime_r(&ts.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
	fprintf(stderr, "%s.%03ld moverd %-5s %s\n", stamp, ts.tv_nsec / 1000000,
		names[level], line);
}
