/*
 * moverd/log.c - one line per event: "LEVEL message" on stderr with a
 * timestamp, or syslog(3) with the matching priority.
 */
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
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

const char *log_safe(const char *s, char *buf, size_t cap)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0, max = cap < LOG_SAFE_BUF ? cap - 4 : LOG_SAFE_MAX;

	if (cap < 8) {
		if (cap)
			buf[0] = 0;
		return buf;
	}
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		bool plain = c >= 0x20 && c < 0x7f && c != '\\';

		if (n + (plain ? 1 : 4) > max) {
			memcpy(buf + n, "...", 4);
			return buf;
		}
		if (plain) {
			buf[n++] = (char)c;
			continue;
		}
		buf[n++] = '\\';
		buf[n++] = 'x';
		buf[n++] = hex[c >> 4];
		buf[n++] = hex[c & 15];
	}
	buf[n] = 0;
	return buf;
}

/* A last guard: no control byte of any line reaches the log, whatever a
 * caller forgot to pass through log_safe (one line stays one line). */
static void neutralize(char *line)
{
	for (; *line; line++)
		if ((unsigned char)*line < 0x20 || *line == 0x7f)
			*line = '?';
}

static void vlog(enum log_level level, const char *fmt, va_list ap,
		 uint64_t suppressed)
{
	char line[1024], stamp[32];
	struct timespec ts;
	struct tm tm;
	size_t n;

	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	if (suppressed)
		snprintf(line + n, sizeof(line) - n,
			 " (%llu similar messages suppressed)",
			 (unsigned long long)suppressed);
	neutralize(line);
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

void log_msg(enum log_level level, const char *fmt, ...)
{
	va_list ap;

	if (level > max_level)
		return;
	va_start(ap, fmt);
	vlog(level, fmt, ap, 0);
	va_end(ap);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void log_limited(struct log_limit *lim, enum log_level level,
		 const char *fmt, ...)
{
	uint64_t now = now_ns();
	va_list ap;

	if (level > max_level)
		return;
	if (!lim->window_ns || now - lim->window_ns >= 1000000000ull) {
		lim->window_ns = now;
		lim->in_window = 0;
	}
	if (lim->in_window >= LOG_LIMIT_BURST) {
		lim->suppressed++;
		return;
	}
	lim->in_window++;
	va_start(ap, fmt);
	vlog(level, fmt, ap, lim->suppressed);
	va_end(ap);
	lim->suppressed = 0;
}
