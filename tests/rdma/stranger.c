/*
 * tests/rdma/stranger.c - an RDMA peer that connects and says nothing:
 * an unauthenticated stranger, for what moverd allocates before a hello
 * (tests/rdma/stranger.sh, in the soft-RoCE guest).
 *
 *   usage: stranger ADDR PORT SECONDS [imm|nortu|deaf]
 *
 * Connects one RC queue pair with rdma_cm, prints "connected", holds the
 * connection SECONDS (or until moverd drops it), then exits 0; non-zero
 * if the connection could not be made.  With "imm" it first posts an RDMA
 * WRITE with immediate data of 0 bytes (no rkey needed, and no hello
 * either), which completes on moverd's side as RECV_RDMA_WITH_IMM, an
 * opcode the protocol never uses, and prints "disconnected" if moverd
 * drops the connection within SECONDS.
 *
 * With "nortu" the connection never comes up: it sends its connect
 * request, prints "requested" and reads no CM event for SECONDS, so
 * librdmacm never sends the RTU that would answer moverd's reply (it does
 * so when the CONNECT_RESPONSE is read).  With "deaf" it is a listener at
 * ADDR:PORT that never answers: it prints "listening" and reads no CM
 * event (no accept, no reject) for SECONDS.
 */
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* A 0-byte RDMA WRITE with immediate data, and its completion here. */
static int write_imm(struct rdma_cm_id *id)
{
	struct ibv_send_wr wr = {
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(1),
	}, *bad;
	struct ibv_wc wc;
	int n = 0;

	if (ibv_post_send(id->qp, &wr, &bad)) {
		perror("stranger: ibv_post_send");
		return -1;
	}
	for (int i = 0; i < 2000 && !(n = ibv_poll_cq(id->send_cq, 1, &wc)); i++)
		usleep(1000);
	printf("write with immediate data: %s\n",
	       n == 1 ? ibv_wc_status_str(wc.status) : "no completion");
	fflush(stdout);
	return 0;
}

/* A listener whose connect requests wait, unanswered, for SECONDS. */
static int deaf(struct rdma_event_channel *ch, struct addrinfo *ai, int secs)
{
	struct rdma_cm_id *id;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(id, ai->ai_addr) || rdma_listen(id, 16)) {
		perror("stranger: listen");
		return 1;
	}
	printf("listening\n");
	fflush(stdout);
	sleep(secs);
	rdma_destroy_id(id);
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

	const char *mode = argc == 5 ? argv[4] : "";

	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: stranger ADDR PORT SECONDS "
			"[imm|nortu|deaf]\n");
		return 2;
	}
	ch = rdma_create_event_channel();
	if (!ch || getaddrinfo(argv[1], argv[2], NULL, &ai)) {
		perror("stranger: set-up");
		return 1;
	}
	if (!strcmp(mode, "deaf"))
		return deaf(ch, ai, atoi(argv[3]));
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, ai->ai_addr, 2000) ||
	    next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED) ||
	    rdma_resolve_route(id, 2000) ||
	    next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) ||
	    rdma_create_qp(id, NULL, &qa) || rdma_connect(id, &cp)) {
		perror("stranger: connect");
		return 1;
	}
	if (!strcmp(mode, "nortu")) {
		printf("requested\n");
		fflush(stdout);
		sleep(atoi(argv[3]));
		return 0;
	}
	if (next_event(ch, RDMA_CM_EVENT_ESTABLISHED)) {
		perror("stranger: connect");
		return 1;
	}
	printf("connected\n");
	fflush(stdout);
	if (!strcmp(mode, "imm") && write_imm(id))
		return 1;
	/* wait out the time, or moverd's disconnect */
	pfd = (struct pollfd){ .fd = ch->fd, .events = POLLIN };
	if (poll(&pfd, 1, atoi(argv[3]) * 1000) == 1 &&
	    !next_event(ch, RDMA_CM_EVENT_DISCONNECTED))
		printf("disconnected\n");
	rdma_disconnect(id);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	freeaddrinfo(ai);
	rdma_destroy_event_channel(ch);
	return 0;
}
