/*
 * tests/bench/metricsbench.c - what `moverd --metrics` costs per scrape
 * with a large counters file (made here, as moverd would fill it): 4096
 * flows with 64-byte names and 16 subscribers each, 256 peers.  A program
 * that prints figures, not a test.
 *
 *   render  metrics_render alone: CPU and bytes per call, both formats
 *   http    metrics_http on loopback, scraped back to back for SECONDS
 *           while a thread plays the sampler (a pass every period_ms):
 *           scrapes done, the server's CPU per scrape (the process's CPU
 *           less the scraping thread's)
 *   slow    16 connections (4 from each of 127.0.0.1-4) that ask and never
 *           read, SPACING ms apart; VmRSS before and after them
 *
 *   dump    one render of each format to stdout, with texts that need
 *           escaping here and there (to compare two builds' bytes)
 *
 *   usage: metricsbench render [N] | http [SECONDS] | slow [SPACING_MS]
 *          | dump
 *
 * It links metrics_http.c and metrics_text.c, so the same program built
 * against older sources measures them.
 */
#include "../../ipc/counters.h"
#include "metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FLOWS 4096u
#define PEERS 256u
#define PORT  19471

static struct fmc_header *h;
static _Atomic bool stop;
static bool weird;      /* dump: texts with bytes to escape */

/* Texts with \\, " and newline first, last, doubled, alone. */
static const char *const weirds[] = { "\"a", "b\\", "\n", "\\\\\"\"\n\n",
	"x\"y\\z\nw", "", "=,{}'` ~", "\\n" };

static double cpu_s(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void put_rec(uint32_t i, enum fmc_type type, const char *name,
		    const char *where)
{
	struct fmc_record *r = fmc_record(h, i);

	fmc_begin(r);
	atomic_store(&r->state, FMC_ACTIVE);
	atomic_store(&r->type, type);
	fmc_set_text(r, FMC_NAME, name);
	fmc_set_text(r, FMC_WHERE, where);
	for (unsigned v = 0; v < FMC_VALUES; v++)
		fmc_set(r, v, (uint64_t)i * 1000003u + v);
	if (type == FMC_FLOW) {
		fmc_set(r, FMC_F_ROLE, 1 + i % 2);
		fmc_set(r, FMC_F_STATE, 0);
		fmc_set(r, FMC_F_SUB_MASK, 0xffff);
	}
	fmc_end(r);
}

static void make_file(void)
{
	size_t bytes = fmc_file_bytes(FLOWS, PEERS);
	char name[72], where[48];

	h = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
	if (!h)
		exit(1);
	memset(h, 0, bytes);
	*h = (struct fmc_header){ .magic = FMC_MAGIC, .version = FMC_VERSION,
		.hdr_bytes = FMC_HDR_BYTES, .rec_bytes = FMC_REC_BYTES,
		.n_flow = FLOWS, .n_peer = PEERS, .pid = (uint32_t)getpid(),
		.values = FMC_VALUES, .period_ms = FMC_DEFAULT_PERIOD_MS,
		.start_unix_ns = 1700000000000000000ull };
	put_rec(0, FMC_DAEMON, "moverd", "bench");
	for (uint32_t i = 0; i < FLOWS; i++) {
		snprintf(name, sizeof(name), "pipeline.stage-%04u.%.*s", i, 44,
			 "abcdefghijklmnopqrstuvwxyz_ABCDEFGHIJKLMNOPQRSTUVWXYZ");
		snprintf(where, sizeof(where), "10.1.%u.%u:7400", i / 16 % 256,
			 i % 16);
		put_rec(fmc_first_flow(h) + i, FMC_FLOW,
			weird && i >= 8 && i < 16 ? weirds[i - 8] : name,
			weird && i < 8 ? weirds[i] : where);
	}
	for (uint32_t i = 0; i < PEERS; i++) {
		snprintf(name, sizeof(name), "[fd00::%x]:7400", i);
		put_rec(fmc_first_peer(h) + i, FMC_PEER,
			weird && i < 8 ? weirds[7 - i] : name, "");
	}
	if (!fmc_valid(h, bytes)) {
		fprintf(stderr, "the made file is not valid\n");
		exit(1);
	}
}

static void bench_render(unsigned n)
{
	for (int om = 0; om < 2; om++) {
		double t0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
		size_t len = 0;

		for (unsigned i = 0; i < n; i++)
			free(metrics_render(h, om, &len));
		printf("render %-11s %7.1f ms CPU per call, %zu bytes\n",
		       om ? "openmetrics" : "text",
		       (cpu_s(CLOCK_PROCESS_CPUTIME_ID) - t0) * 1e3 / n, len);
	}
}

static void bench_dump(void)
{
	for (int om = 0; om < 2; om++) {
		size_t len;
		char *text = metrics_render(h, om, &len);

		if (!text || fwrite(text, 1, len, stdout) != len)
			exit(1);
		free(text);
	}
}

/* The sampler: a pass every period, one value of one flow moved. */
static void *sampler(void *arg)
{
	(void)arg;
	for (uint64_t pass = 1; !atomic_load(&stop); pass++) {
		struct fmc_record *r = fmc_record(h, fmc_first_flow(h));

		usleep(FMC_DEFAULT_PERIOD_MS * 1000);
		fmc_begin(r);
		fmc_set(r, FMC_F_BYTES_SENT, pass);
		fmc_end(r);
		atomic_store_explicit(&h->sample_seq, pass,
				      memory_order_release);
	}
	return NULL;
}

static int dial(const char *from)
{
	struct sockaddr_in src = { .sin_family = AF_INET };
	struct sockaddr_in dst = { .sin_family = AF_INET,
				   .sin_port = htons(PORT) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	inet_pton(AF_INET, from, &src.sin_addr);
	inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
	if (fd < 0 || bind(fd, (struct sockaddr *)&src, sizeof(src)) ||
	    connect(fd, (struct sockaddr *)&dst, sizeof(dst))) {
		perror("connect");
		exit(1);
	}
	return fd;
}

/* One GET on a connection of its own, read to the end: bytes read. */
static size_t scrape(void)
{
	static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n"
				  "Connection: close\r\n\r\n";
	static char buf[1 << 16];
	int fd = dial("127.0.0.1");
	size_t got = 0;
	ssize_t n;

	if (write(fd, req, sizeof(req) - 1) != sizeof(req) - 1)
		exit(1);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		got += (size_t)n;
	close(fd);
	return got;
}

static void bench_http(unsigned seconds)
{
	struct metrics_http *m = metrics_http_start("127.0.0.1:19471", h, NULL);
	double t0, c0, w0, client = 0;
	unsigned n = 0;
	size_t got = 0;
	pthread_t th;

	if (!m)
		exit(1);
	pthread_create(&th, NULL, sampler, NULL);
	t0 = cpu_s(CLOCK_MONOTONIC);
	c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
	while (cpu_s(CLOCK_MONOTONIC) - t0 < seconds) {
		w0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
		got = scrape();
		client += cpu_s(CLOCK_THREAD_CPUTIME_ID) - w0;
		n++;
	}
	c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0 - client;
	atomic_store(&stop, true);
	pthread_join(th, NULL);
	metrics_http_stop(m);
	printf("http: %u scrapes in %u s (%.1f/s), %zu bytes each; server "
	       "CPU %.2f s: %.1f ms per scrape, %.0f%% of a core\n", n,
	       seconds, n / (double)seconds, got, c0, c0 * 1e3 / n,
	       c0 * 100 / seconds);
}

static long rss_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6))
			kb = atol(line + 6);
	if (f)
		fclose(f);
	return kb;
}

static void bench_slow(unsigned spacing_ms)
{
	static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
	struct metrics_http *m = metrics_http_start("127.0.0.1:19471", h, NULL);
	long before;
	int fds[16];
	pthread_t th;

	if (!m)
		exit(1);
	pthread_create(&th, NULL, sampler, NULL);
	scrape();       /* the first render's buffers, counted in both */
	before = rss_kb();
	for (unsigned i = 0; i < 16; i++) {
		char from[16];
		int small = 4096;

		snprintf(from, sizeof(from), "127.0.0.%u", 1 + i / 4);
		fds[i] = dial(from);
		setsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &small,
			   sizeof(small));
		if (write(fds[i], req, sizeof(req) - 1) != sizeof(req) - 1)
			exit(1);
		usleep(spacing_ms * 1000 + 50000);
	}
	usleep(500000);
	printf("slow: 16 readers that do not read, %u ms apart: VmRSS %ld -> "
	       "%ld MB\n", spacing_ms, before / 1024, rss_kb() / 1024);
	for (unsigned i = 0; i < 16; i++)
		close(fds[i]);
	atomic_store(&stop, true);
	pthread_join(th, NULL);
	metrics_http_stop(m);
}

int main(int argc, char **argv)
{
	unsigned arg = argc > 2 ? (unsigned)atoi(argv[2]) : 0;

	if (argc < 2) {
		fprintf(stderr, "usage: metricsbench render [N] | http "
			"[SECONDS] | slow [SPACING_MS] | dump\n");
		return 2;
	}
	weird = !strcmp(argv[1], "dump");
	make_file();
	if (weird)
		bench_dump();
	else if (!strcmp(argv[1], "render"))
		bench_render(arg ? arg : 5);
	else if (!strcmp(argv[1], "http"))
		bench_http(arg ? arg : 10);
	else if (!strcmp(argv[1], "slow"))
		bench_slow(arg);
	else
		return 2;
	return 0;
}
