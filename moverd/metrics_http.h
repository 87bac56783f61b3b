/*
 * moverd/metrics_http.h - `moverd --metrics HOST:PORT`: the counters file
 * (ipc/counters.h) as Prometheus text at GET /metrics (and OpenMetrics
 * 1.0.0 to a scraper that asks for it), served by libmicrohttpd in its own
 * thread.  The thread reads only the counters mapping, never moverd's
 * structures: a slow or hostile scraper cannot stall the mover, and no
 * lock is shared with it.
 */
#ifndef MOVERD_METRICS_HTTP_H
#define MOVERD_METRICS_HTTP_H

#include "../ipc/counters.h"
#include "auth.h"

#include <stddef.h>

struct metrics_http;

/* Scrapers served at once, and from one address; seconds a connection
 * may stay idle.  Beyond them MHD refuses the connection at accept. */
#define METRICS_MAX_CONNS    16u
#define METRICS_PER_IP_CONNS 4u
#define METRICS_TIMEOUT_S    5u

/*
 * Listen on addr ("HOST:PORT", resolved at start) and serve the counters
 * mapped at h; with a token (NULL: none), only to a request that shows it
 * (`Authorization: Bearer TOKEN`), others get 401.  NULL after logging why
 * (address, bind).
 */
struct metrics_http *metrics_http_start(const char *addr,
					const struct fmc_header *h,
					const struct auth_token *token);

/* Serve to requests that show this token from now on (a reload read its
 * file again): true if it differs from the one in use.  Not with a server
 * started without one. */
bool metrics_http_set_token(struct metrics_http *m,
			    const struct auth_token *token);

/* Stop the thread (before the counters mapping goes). */
void metrics_http_stop(struct metrics_http *m);

/* The text of one scrape into a malloc'd buffer (metrics_text.c; the
 * tests call it too); openmetrics: the OpenMetrics 1.0.0 variant.  NULL:
 * out of memory. */
char *metrics_render(const struct fmc_header *h, bool openmetrics,
		     size_t *len);

#endif
