/*
 * moverd/metrics_http.c - Prometheus / OpenMetrics text of the counters
 * file, served by libmicrohttpd's own polling thread.
 *
 * Why libmicrohttpd and its thread rather than moverd's io_uring loop: an
 * HTTP server (request parsing, keep-alive, slow clients, limits) is
 * well-kept code we do not have to write, and running it beside the loop
 * keeps every byte of a scrape off the mover's cpu time and latency.  The
 * thread touches nothing but the read-only view of the counters file
 * (fmc_read's sequence lock), the same as any outside reader.
 */
#include "metrics_http.h"
#include "log.h"
#include "resolver.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct metrics_http {
	struct MHD_Daemon *d;
	const struct fmc_header *h;
};

/* ---- HTTP --------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
			     const char *type, char *body, size_t len,
			     enum MHD_ResponseMemoryMode mode)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body,
								 mode);
	enum MHD_Result rc;

	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", type);
	rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return rc;
}

static enum MHD_Result serve(void *cls, struct MHD_Connection *c,
			     const char *url, const char *method,
			     const char *version, const char *upload,
			     size_t *upload_size, void **state)
{
	struct metrics_http *m = cls;
	const char *accept;
	bool om;
	char *body;
	size_t len;

	(void)version;
	(void)upload;
	(void)upload_size;
	(void)state;
	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
			     "GET /metrics\n", 13, MHD_RESPMEM_PERSISTENT);
	if (strcmp(url, "/metrics"))
		return reply(c, MHD_HTTP_NOT_FOUND, "text/plain",
			     "GET /metrics\n", 13, MHD_RESPMEM_PERSISTENT);
	accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
					     MHD_HTTP_HEADER_ACCEPT);
	om = accept && strstr(accept, "application/openmetrics-text");
	body = metrics_render(m->h, om, &len);
	if (!body)
		return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain",
			     "out of memory\n", 14, MHD_RESPMEM_PERSISTENT);
	return reply(c, MHD_HTTP_OK, om ?
		     "application/openmetrics-text; version=1.0.0; charset=utf-8" :
		     "text/plain; version=0.0.4; charset=utf-8",
		     body, len, MHD_RESPMEM_MUST_FREE);
}

struct metrics_http *metrics_http_start(const char *addr,
					const struct fmc_header *h)
{
	struct resolver_result res;
	struct metrics_http *m;
	int rc;

	if (!h) {
		log_error("--metrics %s: no counters file to serve", addr);
		return NULL;
	}
	rc = resolver_lookup_now(addr, &res);
	if (rc) {
		log_error("--metrics %s: %s", addr, strerror(-rc));
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->h = h;
	m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
				(res.sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
				0, NULL, NULL, serve, m,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&res.sa,
				MHD_OPTION_CONNECTION_LIMIT, METRICS_MAX_CONNS,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT,
				METRICS_PER_IP_CONNS,
				MHD_OPTION_CONNECTION_TIMEOUT, METRICS_TIMEOUT_S,
				MHD_OPTION_END);
	if (!m->d) {
		log_error("--metrics %s: cannot listen there (in use?)", addr);
		free(m);
		return NULL;
	}
	log_info("metrics at http://%s/metrics", addr);
	return m;
}

void metrics_http_stop(struct metrics_http *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->d);
	free(m);
}
