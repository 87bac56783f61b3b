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
 *
 * Why one shared body per format: rendering thousands of flows costs
 * tenths of a second and tens of MB, and the port is open to anyone who
 * reaches it.  A scrape gets the last body rendered (a refcounted
 * MHD_Response: each connection sending it holds a reference) unless the
 * sampler has written since and the body is older than a period, so
 * scrapers in a loop cost one render per period, and sixteen connections
 * one body, not sixteen.
 *
 * With --metrics-token the text goes only to a request that shows the
 * token (Prometheus: `authorization: {credentials_file: ...}`): the port
 * is anyone's who reaches it, every local user's on loopback, and the
 * text names every flow and peer of the host.
 */
#include "metrics_http.h"
#include "log.h"
#include "resolver.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* A render may be reused for this many times what it cost: rendering
 * takes at most a tenth of the thread, however large the file. */
#define RENDER_SHARE 10u

/* The last body of one format and what it was made from. */
struct shared {
	struct MHD_Response *r;   /* our reference; NULL: none yet */
	uint64_t seq;             /* the sampler's pass it read */
	uint64_t at_ns, cost_ns;  /* when it was rendered, in how long */
};

/* shared[] is only touched by serve(), which MHD calls from its one
 * polling thread (MHD_USE_INTERNAL_POLLING_THREAD, no thread pool nor
 * thread per connection): it needs no lock.  With more threads it would. */
struct metrics_http {
	struct MHD_Daemon *d;
	const struct fmc_header *h;
	struct shared shared[2];  /* [0] Prometheus text, [1] OpenMetrics */
	bool need_token;
	/* the token's hash (auth.h): read by the server's thread at each
	 * request, replaced by moverd's loop at a reload; the lock orders
	 * the two (a request sees the old hash or the new, never a mix) */
	pthread_mutex_t lock;
	struct auth_token token;
};

static const char *const types[2] = {
	"text/plain; version=0.0.4; charset=utf-8",
	"application/openmetrics-text; version=1.0.0; charset=utf-8",
};

/* ---- HTTP --------------------------------------------------------------------- */

/* A short answer that is not the metrics (an error, a refusal); a 401
 * says which scheme it wants. */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
			     const char *text)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	enum MHD_Result rc;

	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", "text/plain");
	if (status == MHD_HTTP_UNAUTHORIZED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
					"Bearer realm=\"moverd metrics\"");
	rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return rc;
}

static bool blank(char c)
{
	return c == ' ' || c == '\t';
}

/* Does the request show the token (or is none asked for)?  The scheme's
 * name in any case, then one or more blanks; blanks after the token are
 * not its own. */
static bool token_shown(struct metrics_http *m,
			struct MHD_Connection *c)
{
	const char *v;
	size_t len;
	bool ok;

	if (!m->need_token)
		return true;
	v = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
					MHD_HTTP_HEADER_AUTHORIZATION);
	if (!v || strncasecmp(v, "Bearer", 6) || !blank(v[6]))
		return false;
	v += 6;
	v += strspn(v, " \t");
	len = strlen(v);
	while (len && blank(v[len - 1]))
		len--;
	pthread_mutex_lock(&m->lock);
	ok = auth_token_ok(&m->token, v, len);
	pthread_mutex_unlock(&m->lock);
	return ok;
}

bool metrics_http_set_token(struct metrics_http *m,
			    const struct auth_token *token)
{
	bool changed;

	if (!m->need_token)
		return false;
	pthread_mutex_lock(&m->lock);
	changed = memcmp(&m->token, token, sizeof(*token)) != 0;
	m->token = *token;
	pthread_mutex_unlock(&m->lock);
	return changed;
}

/* A request is over: the token it showed lies in the connection's memory
 * until MHD reuses it; zeroed now, so that moverd keeps only its hash. */
static void forget_request(void *cls, struct MHD_Connection *c,
			   void **state, enum MHD_RequestTerminationCode toe)
{
	const char *v = MHD_lookup_connection_value(
		c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);

	(void)cls;
	(void)state;
	(void)toe;
	if (v)
		auth_wipe((char *)v, strlen(v));
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* How long a body stays good once the sampler has moved on: a sampler
 * period (fresher figures do not exist), or longer if rendering is dear. */
static uint64_t good_ns(const struct metrics_http *m, const struct shared *s)
{
	uint64_t period = (uint64_t)m->h->period_ms * 1000000ull;

	return s->cost_ns * RENDER_SHARE > period ? s->cost_ns * RENDER_SHARE :
						      period;
}

/* The body of format om to queue: the shared one, rendered again first
 * if it is stale.  NULL: out of memory. */
static struct MHD_Response *shared_body(struct metrics_http *m, bool om)
{
	struct shared *s = &m->shared[om];
	/* acquire: the records are at least as new as this pass */
	uint64_t seq = atomic_load_explicit(
		&((struct fmc_header *)m->h)->sample_seq, memory_order_acquire);
	uint64_t now = mono_ns();
	struct MHD_Response *r;
	size_t len;
	char *text;

	if (s->r && (seq == s->seq || now - s->at_ns < good_ns(m, s)))
		return s->r;
	text = metrics_render(m->h, om, &len);
	if (!text)
		return NULL;
	r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(text);
		return NULL;
	}
	MHD_add_response_header(r, "Content-Type", types[om]);
	/* connections still sending the old body hold their own reference */
	if (s->r)
		MHD_destroy_response(s->r);
	*s = (struct shared){ .r = r, .seq = seq, .at_ns = now,
			      .cost_ns = mono_ns() - now };
	return r;
}

/* HEAD is answered from the same body: MHD sends its headers (the
 * length GET would get) and no bytes of it. */
static enum MHD_Result serve(void *cls, struct MHD_Connection *c,
			     const char *url, const char *method,
			     const char *version, const char *upload,
			     size_t *upload_size, void **state)
{
	struct metrics_http *m = cls;
	struct MHD_Response *r;
	const char *accept;
	bool om;

	(void)version;
	(void)upload;
	(void)upload_size;
	(void)state;
	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET /metrics\n");
	if (strcmp(url, "/metrics"))
		return reply(c, MHD_HTTP_NOT_FOUND, "GET /metrics\n");
	if (!token_shown(m, c))
		return reply(c, MHD_HTTP_UNAUTHORIZED, "a bearer token is "
			     "needed (moverd --metrics-token)\n");
	accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
					     MHD_HTTP_HEADER_ACCEPT);
	om = accept && strstr(accept, "application/openmetrics-text");
	r = shared_body(m, om);
	if (!r)
		return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
			     "out of memory\n");
	return MHD_queue_response(c, MHD_HTTP_OK, r);
}

struct metrics_http *metrics_http_start(const char *addr,
					const struct fmc_header *h,
					const struct auth_token *token)
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
	pthread_mutex_init(&m->lock, NULL);
	if (token) {
		m->need_token = true;
		m->token = *token;
	}
	m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
				(res.sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
				0, NULL, NULL, serve, m,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&res.sa,
				MHD_OPTION_CONNECTION_LIMIT, METRICS_MAX_CONNS,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT,
				METRICS_PER_IP_CONNS,
				MHD_OPTION_CONNECTION_TIMEOUT, METRICS_TIMEOUT_S,
				MHD_OPTION_NOTIFY_COMPLETED, forget_request, m,
				MHD_OPTION_END);
	if (!m->d) {
		log_error("--metrics %s: cannot listen there (in use?)", addr);
		pthread_mutex_destroy(&m->lock);
		free(m);
		return NULL;
	}
	log_info("metrics at http://%s/metrics%s", addr,
		 token ? " (to a request with the token)" : "");
	return m;
}

void metrics_http_stop(struct metrics_http *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->d);
	for (unsigned i = 0; i < 2; i++)
		if (m->shared[i].r)
			MHD_destroy_response(m->shared[i].r);
	pthread_mutex_destroy(&m->lock);
	free(m);
}
