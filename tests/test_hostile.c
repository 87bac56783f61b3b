/*
 * tests/test_hostile.c - hostile peers and hostile clients against a real
 * moverd (issue 14).  Each case is one finding of the adversarial review;
 * FM_HOSTILE_CASES=1,3 runs only those.
 *
 *   usage: test_hostile MOVERD MOVERCTL
 */
#include "harness.h"

static const char *moverd_bin, *moverctl_bin;

/* case 0: the harness itself: a hostile peer opens a flow and gets it */
static void case_smoke(void)
{
	struct hd d;
	struct hp_open o = { "smoke", 7, 1 << 16, 1024, 0x1234567800ull, 0 };
	Flowmover__PeerFlowOpened *op = NULL;
	char out[4096];
	int fd;

	hd_start(&d, moverd_bin, "hostile0", true, NULL);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "smoke-peer"));
	CHECK(hp_open(fd, &o));
	CHECK(hp_wait_opened(fd, 7, 5000, &op) == 0);
	CHECK(op->error == 0);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow show smoke --json") == 0);
	CHECK(strstr(out, "receiver"));
	close(fd);
	hd_stop(&d);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 0, case_smoke, "harness: a peer opens a flow" },
	};

	if (argc != 3) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL\n", argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_HOSTILE_CASES");
}
