/*
 * moverd/log.h - levelled logging to stderr (foreground) or syslog.
 *
 * Two rules for lines that outside parties can cause (peers, clients):
 * text they sent goes through log_safe (escaped, capped), and a line they
 * can trigger at will goes through log_limited (at most one a second).
 */
#ifndef MOVERD_LOG_H
#define MOVERD_LOG_H

#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };

void log_setup(enum log_level level, int use_syslog);
int log_parse_level(const char *name, enum log_level *out);
void log_msg(enum log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * Outside text made safe for a log line: bytes outside printable ASCII and
 * the backslash become \xNN, and at most LOG_SAFE_MAX characters of the
 * result are kept ("..." marks a cut).  Writes into buf (cap bytes; at
 * least LOG_SAFE_BUF for the full length) and returns it; s may be NULL.
 */
#define LOG_SAFE_MAX 128
#define LOG_SAFE_BUF (LOG_SAFE_MAX + 4)
const char *log_safe(const char *s, char *buf, size_t cap);

/*
 * One per call site: log_limited prints at most LOG_LIMIT_BURST lines a
 * second through it; the first line after a second with more says how
 * many were suppressed ("(N similar messages suppressed)").  A flood of
 * failures costs a few lines a second, not a line a failure, and a few
 * distinct events close together are all still seen.
 */
#define LOG_LIMIT_BURST 5u
struct log_limit {
	uint64_t window_ns;       /* start of the current second */
	unsigned in_window;       /* lines printed in it */
	uint64_t suppressed;
};
void log_limited(struct log_limit *lim, enum log_level level,
		 const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define log_error(...) log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
