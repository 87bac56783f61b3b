/*
 * tests/fuzz/gen_ctl_corpus.c - writes the seed corpus of fuzz_ctl_frame:
 * one valid frame of each request type and of each response type.
 *   gen_ctl_corpus DIR
 */
#include "ctl_frame.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static const char *dir;

static void put(const char *name, const ProtobufCMessage *m)
{
	static uint8_t buf[CTL_FRAME_BUF];
	char path[4096];
	size_t len;
	FILE *f;

	if (ctl_frame_pack(m, buf, sizeof(buf), &len)) {
		fprintf(stderr, "gen_ctl_corpus: cannot pack %s\n", name);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	Flowmover__Request rq = FLOWMOVER__REQUEST__INIT;
	Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
	Flowmover__FlowSpec sp = FLOWMOVER__FLOW_SPEC__INIT;
	Flowmover__DestroyFlow de = FLOWMOVER__DESTROY_FLOW__INIT;
	Flowmover__ListFlows li = FLOWMOVER__LIST_FLOWS__INIT;
	Flowmover__DescribeFlow ds = FLOWMOVER__DESCRIBE_FLOW__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	Flowmover__GetStatus gs = FLOWMOVER__GET_STATUS__INIT;
	Flowmover__Response rs = FLOWMOVER__RESPONSE__INIT;
	Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT, *fis[1] = { &fi };
	Flowmover__FlowList fl = FLOWMOVER__FLOW_LIST__INIT;
	Flowmover__PeerInfo pi = FLOWMOVER__PEER_INFO__INIT, *pis[1] = { &pi };
	Flowmover__StatusInfo st = FLOWMOVER__STATUS_INFO__INIT;
	Flowmover__Error er = FLOWMOVER__ERROR__INIT;
	Flowmover__Ok ok = FLOWMOVER__OK__INIT;
	uint32_t uids[] = { 1000, 1001 }, gids[] = { 100 };
	char *transports[] = { "local", "tcp" };

	if (argc != 2) {
		fprintf(stderr, "usage: gen_ctl_corpus DIR\n");
		return 2;
	}
	dir = argv[1];

	sp.name = "orders.eu-1";
	sp.ring_size = 1 << 24;
	sp.max_record = 65536;
	sp.peer = "10.0.0.2:7400";
	sp.allow_uids = uids;
	sp.n_allow_uids = 2;
	sp.allow_gids = gids;
	sp.n_allow_gids = 1;
	cr.spec = &sp;
	rq.id = 1;
	rq.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
	rq.create = &cr;
	put("req_create", &rq.base);
	rq.id = 2;
	de.name = "orders.eu-1";
	rq.body_case = FLOWMOVER__REQUEST__BODY_DESTROY;
	rq.destroy = &de;
	put("req_destroy", &rq.base);
	rq.id = 3;
	rq.body_case = FLOWMOVER__REQUEST__BODY_LIST;
	rq.list = &li;
	put("req_list", &rq.base);
	rq.id = 4;
	ds.name = "x";
	rq.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
	rq.describe = &ds;
	put("req_describe", &rq.base);
	rq.id = 5;
	at.name = "metrics_01";
	at.role = FLOWMOVER__ROLE__CONSUMER;
	rq.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	rq.attach = &at;
	put("req_attach", &rq.base);
	rq.id = 6;
	rq.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	rq.status = &gs;
	put("req_status", &rq.base);

	fi.name = "orders.eu-1";
	fi.state = "reconnecting";
	fi.state_reason = "peer 10.0.0.2:7400: connection refused";
	fi.ring_size = 1 << 24;
	fi.max_record = 65536;
	fi.head = 4096;
	fi.tail = 8192;
	fi.producers = 2;
	fi.consumers = 0;
	fi.owner_uid = 1000;
	fi.allow_uids = uids;
	fi.n_allow_uids = 2;
	fi.peer = "10.0.0.2:7400";
	fi.transport = "tcp";
	fi.created_unix_ms = 1700000000000ull;
	fi.bytes_sent = 123456;
	fi.role = "sender";
	rs.id = 5;
	rs.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
	rs.flow = &fi;
	put("resp_flow", &rs.base);
	fl.flows = fis;
	fl.n_flows = 1;
	rs.body_case = FLOWMOVER__RESPONSE__BODY_LIST;
	rs.list = &fl;
	put("resp_list", &rs.base);
	pi.address = "10.0.0.2:7400";
	pi.state = "open";
	pi.transport = "rdma";
	pi.flows = 3;
	pi.reconnects = 1;
	st.version = "0.1.0";
	st.uptime_ms = 86400000;
	st.transports = transports;
	st.n_transports = 2;
	st.peers = pis;
	st.n_peers = 1;
	st.socket_path = "/run/flowmover/moverd.sock";
	st.pid = 4242;
	rs.body_case = FLOWMOVER__RESPONSE__BODY_STATUS;
	rs.status = &st;
	put("resp_status", &rs.base);
	er.code = -ENOENT;
	er.message = "no such flow 'x'";
	rs.body_case = FLOWMOVER__RESPONSE__BODY_ERROR;
	rs.error = &er;
	put("resp_error", &rs.base);
	rs.body_case = FLOWMOVER__RESPONSE__BODY_OK;
	rs.ok = &ok;
	put("resp_ok", &rs.base);
	return 0;
}
