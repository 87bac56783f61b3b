/*
 * tests/bench/adoptbench.c - what re-adopting flows costs moverd at start
 * (issue 15): N local flows (default 1000) are created, moverd is killed
 * (-9) and started again; the figures are the re-adoption moverd logs
 * ("N flows re-adopted in X ms"), the restart's wall time until the
 * control socket answers, and, as references measured in the same run,
 * the same restart with no flows and the rate at which the flows were
 * created; then the time an orderly stop takes with N flows (it lets them
 * go) and the start after it.  A program that prints figures, not a test.
 *
 *   usage: adoptbench MOVERD MOVERCTL [N]
 */
#include "harness.h"

static double ms_since(uint64_t t0)
{
	return (double)(tu_now_ns() - t0) / 1e6;
}

/* The "re-adopted in X ms" figure of moverd's last start. */
static double adopt_ms(const struct hd *d, unsigned *n)
{
	char line[512];
	double ms = -1;
	FILE *f = fopen(d->log, "r");

	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, " flows re-adopted in ");

		if (p) {
			const char *q = p;

			while (q > line && q[-1] != ' ')
				q--;
			*n = (unsigned)strtoul(q, NULL, 10);
			ms = strtod(p + strlen(" flows re-adopted in "), NULL);
		}
	}
	fclose(f);
	return ms;
}

static double restart_ms(struct hd *d, const char *moverd)
{
	uint64_t t0;

	hd_kill(d);
	t0 = tu_now_ns();
	hd_restart(d, moverd, NULL);
	hd_answers(d); /* the loop runs: the flows are re-adopted */
	return ms_since(t0);
}

int main(int argc, char **argv)
{
	const char *const extra[] = { "--log-level", "info", NULL };
	unsigned n = argc > 3 ? (unsigned)atoi(argv[3]) : 1000, got = 0;
	double empty_ms, full_ms, adopt, create_ms, stop_ms;
	struct hd d;
	uint64_t t0;
	int sock;

	if (argc < 3) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL [N]\n", argv[0]);
		return 2;
	}
	hd_start(&d, argv[1], "adoptbench", false, extra);
	empty_ms = restart_ms(&d, argv[1]);
	sock = ctl_connect(d.sock);
	CHECK(sock >= 0);
	t0 = tu_now_ns();
	for (unsigned i = 0; i < n; i++) {
		char name[32];

		snprintf(name, sizeof(name), "f%u", i);
		CHECK_RC(hc_create(sock, name, 4096, 0), 0);
	}
	create_ms = ms_since(t0);
	close(sock);
	full_ms = restart_ms(&d, argv[1]);
	adopt = adopt_ms(&d, &got);
	CHECK(got == n);
	printf("adoptbench: %u local flows (4 KiB rings, state dir %s/rings)\n",
	       n, d.dir);
	printf("  re-adopted at start:     %8.1f ms  = %8.0f flows/s\n", adopt,
	       n / (adopt / 1e3));
	printf("  created (reference):     %8.1f ms  = %8.0f flows/s "
	       "(adoption %.1fx the create rate)\n", create_ms,
	       n / (create_ms / 1e3), create_ms / adopt);
	printf("  restart until it serves: %8.1f ms with %u flows, %.1f ms "
	       "with none (ratio %.2f)\n", full_ms, n, empty_ms,
	       full_ms / empty_ms);
	/* an orderly stop lets every flow go; the next start re-adopts */
	t0 = tu_now_ns();
	hd_term(&d);
	stop_ms = ms_since(t0);
	t0 = tu_now_ns();
	hd_restart(&d, argv[1], NULL);
	hd_answers(&d);
	full_ms = ms_since(t0);
	adopt = adopt_ms(&d, &got);
	CHECK(got == n);
	printf("  orderly stop (SIGTERM):  %8.1f ms with %u flows; the start "
	       "after it %.1f ms, re-adoption %.1f ms\n", stop_ms, n, full_ms,
	       adopt);
	hd_stop(&d);
	return 0;
}
