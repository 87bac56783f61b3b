/*
 * tests/rdma/stranger.c - an RDMA peer that connects and says nothing:
 * an unauthenticated stranger, for what moverd allocates before a hello
 * (tests/rdma/stranger.sh, in the soft-RoCE guest).
 *
 *   usage: stranger ADDR PORT SECONDS
 *
 * Connects one RC queue pair with rdma_cm, prints "connected", holds the
 * connection SECONDS (or until moverd drops it), then exits 0; non-zero
 * if the connection could not be made.
 */
#include <rdma/rdma_cma.h>

#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	int got;

	if (rdma_get_cm_event(ch, &ev))
		return -1;
	got = ev->event;
	rdma_ack_cm_event(ev);
	if (got != (int)want) {
		fprintf(stderr, "stranger: %s, not %s\n", rdma_event_str(got),
			rdma_event_str(want));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct addrinfo *ai;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct rdma_conn_param cp = { .retry_count = 7, .rnr_retry_count = 7 };
	struct pollfd pfd;

	if (argc != 4) {
		fprintf(stderr, "usage: stranger ADDR PORT SECONDS\n");
		return 2;
	}
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    getaddrinfo(argv[1], argv[2], NULL, &ai) ||
	    rdma_resolve_addr(id, NULL, ai->ai_addr, 2000) ||
	    next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED) ||
	    rdma_resolve_route(id, 2000) ||
	    next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) ||
	    rdma_create_qp(id, NULL, &qa) || rdma_connect(id, &cp) ||
	    next_event(ch, RDMA_CM_EVENT_ESTABLISHED)) {
		perror("stranger: connect");
		return 1;
	}
	printf("connected\n");
	fflush(stdout);
	/* nothing is sent: wait out the time, or moverd's disconnect */
	pfd = (struct pollfd){ .fd = ch->fd, .events = POLLIN };
	poll(&pfd, 1, atoi(argv[3]) * 1000);
	rdma_disconnect(id);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	freeaddrinfo(ai);
	rdma_destroy_event_channel(ch);
	return 0;
}
