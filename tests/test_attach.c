/*
 * tests/test_attach.c - flowshm_attach against a fake moverd that listens
 * on a temporary socket ($FLOWMOVER_SOCKET) and answers one request per
 * connection as the test tells it.  It hands out rings owned by uid 0 and
 * ignores an owner asked for, as a moverd older than
 * flowshm_attach_owned: the library itself refuses another owner's flow.
 */
#include "testutil.h"

#include "ctl_client.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/un.h>

enum mode { GIVE_RING, NO_FLOW, DENIED, NO_FD, WRONG_BODY, SILENT_CLOSE };

struct fake {
	int listen_fd;
	int ring_fd;
	enum mode mode;
	Flowmover__Role role;   /* what the client asked for */
	char name[80];
	bool check_owner;       /* ... and the owner it asked for */
	uint32_t owner_uid;
};

static void *fake_moverd(void *arg)
{
	struct fake *fk = arg;
	static uint8_t in[CTL_MAX_FRAME];
	uint8_t out[CTL_FRAME_BUF];
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT;
	Flowmover__Ok ok = FLOWMOVER__OK__INIT;
	Flowmover__Request *req;
	char err[CTL_ERR_MAX];
	size_t got, len;
	int c = accept(fk->listen_fd, NULL, NULL);

	CHECK(c >= 0);
	CHECK_RC(ctl_recv_frame(c, in, sizeof(in), &got, NULL, 5000), 0);
	CHECK_RC(ctl_request_decode(in, got, &req, err, sizeof(err)), 0);
	CHECK(req->body_case == FLOWMOVER__REQUEST__BODY_ATTACH);
	fk->role = req->attach->role;
	fk->check_owner = req->attach->check_owner;
	fk->owner_uid = req->attach->owner_uid;
	snprintf(fk->name, sizeof(fk->name), "%s", req->attach->name);
	resp.id = req->id;
	fi.name = req->attach->name;
	fi.owner_uid = 0; /* an older moverd: it does not check the owner */
	switch (fk->mode) {
	case GIVE_RING:
	case NO_FD:
		resp.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
		resp.flow = &fi;
		CHECK_RC(ctl_send_msg(c, &resp.base,
				      fk->mode == GIVE_RING ? fk->ring_fd : -1),
			 0);
		break;
	case WRONG_BODY:
		resp.body_case = FLOWMOVER__RESPONSE__BODY_OK;
		resp.ok = &ok;
		CHECK_RC(ctl_send_msg(c, &resp.base, fk->ring_fd), 0);
		break;
	case NO_FLOW:
		CHECK_RC(ctl_error_frame(req->id, -ENOENT,
					 "no such flow 'ghost'", out,
					 sizeof(out), &len), 0);
		CHECK_RC(ctl_send_frame(c, out, len, -1), 0);
		break;
	case DENIED:
		CHECK_RC(ctl_error_frame(req->id, -EACCES,
					 "uid 1234 may not attach to flow "
					 "'secret'", out, sizeof(out), &len),
			 0);
		CHECK_RC(ctl_send_frame(c, out, len, -1), 0);
		break;
	case SILENT_CLOSE:
		break;
	}
	ctl_request_free(req);
	close(c);
	return NULL;
}

/* owner < 0: flowshm_attach, else flowshm_attach_owned */
static int attach_owned_with(struct fake *fk, enum mode mode,
			     const char *name, enum flowshm_role role,
			     int64_t owner, flowshm_t **f)
{
	pthread_t t;
	int rc;

	fk->mode = mode;
	CHECK(pthread_create(&t, NULL, fake_moverd, fk) == 0);
	rc = owner < 0 ? flowshm_attach(name, role, NULL, f) :
			 flowshm_attach_owned(name, role, (uint32_t)owner,
					      NULL, 0, f);
	CHECK(pthread_join(t, NULL) == 0);
	return rc;
}

static int attach_with(struct fake *fk, enum mode mode, const char *name,
		       enum flowshm_role role, flowshm_t **f)
{
	return attach_owned_with(fk, mode, name, role, -1, f);
}

int main(void)
{
	char dir[] = "/tmp/attach-test-XXXXXX", path[128];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct fake fk = { 0 };
	flowshm_t *p = NULL, *c = NULL;
	char buf[64];
	size_t len;

	CHECK(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/moverd.sock", dir);
	setenv("FLOWMOVER_SOCKET", path, 1);

	/* no daemon */
	CHECK_RC(flowshm_attach("f", FLOWSHM_PRODUCER, NULL, &p), -ECONNREFUSED);
	CHECK(p == NULL);
	CHECK(strstr(flowshm_attach_error(), "not running"));

	/* bad arguments never reach the daemon */
	CHECK_RC(flowshm_attach("bad name", FLOWSHM_PRODUCER, NULL, &p), -EINVAL);
	CHECK_RC(flowshm_attach("f", (enum flowshm_role)0, NULL, &p), -EINVAL);
	CHECK_RC(flowshm_attach(NULL, FLOWSHM_CONSUMER, NULL, &p), -EINVAL);

	fk.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	strcpy(sa.sun_path, path);
	CHECK(bind(fk.listen_fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(fk.listen_fd, 4) == 0);
	fk.ring_fd = tu_ring(1 << 16, 1024, 0);

	/* the real thing: both ends from moverd, a record goes through */
	CHECK_RC(attach_with(&fk, GIVE_RING, "orders", FLOWSHM_PRODUCER, &p), 0);
	CHECK(fk.role == FLOWMOVER__ROLE__PRODUCER && !strcmp(fk.name, "orders"));
	CHECK_RC(attach_with(&fk, GIVE_RING, "orders", FLOWSHM_CONSUMER, &c), 0);
	CHECK(fk.role == FLOWMOVER__ROLE__CONSUMER);
	CHECK(!strcmp(flowshm_attach_error(), ""));
	CHECK_RC(flowshm_send(p, "hello", 5, 0), 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
	CHECK(len == 5 && !memcmp(buf, "hello", 5));
	flowshm_detach(p);
	flowshm_detach(c);

	/* the daemon's refusals come through with their words */
	CHECK_RC(attach_with(&fk, NO_FLOW, "ghost", FLOWSHM_CONSUMER, &c),
		 -ENOENT);
	CHECK(c == NULL);
	CHECK(!strcmp(flowshm_attach_error(), "no such flow 'ghost'"));
	CHECK_RC(attach_with(&fk, DENIED, "secret", FLOWSHM_PRODUCER, &p),
		 -EACCES);
	CHECK(strstr(flowshm_attach_error(), "may not attach"));

	/* the owner asked for goes to moverd, and the library checks the
	 * answer too (a moverd older than the check) */
	CHECK_RC(attach_with(&fk, GIVE_RING, "orders", FLOWSHM_CONSUMER, &c),
		 0);
	CHECK(!fk.check_owner);
	flowshm_detach(c);
	CHECK_RC(attach_owned_with(&fk, GIVE_RING, "orders", FLOWSHM_CONSUMER,
				   1234, &c), -EACCES);
	CHECK(c == NULL);
	CHECK(fk.check_owner && fk.owner_uid == 1234);
	CHECK(strstr(flowshm_attach_error(), "owned by uid 0, not by uid 1234"));
	CHECK_RC(attach_owned_with(&fk, GIVE_RING, "orders", FLOWSHM_CONSUMER,
				   0, &c), 0);
	CHECK(fk.check_owner && fk.owner_uid == 0);
	flowshm_detach(c);

	/* nonsense */
	CHECK_RC(attach_with(&fk, NO_FD, "orders", FLOWSHM_PRODUCER, &p),
		 -EPROTO);
	CHECK(strstr(flowshm_attach_error(), "no ring descriptor"));
	CHECK_RC(attach_with(&fk, WRONG_BODY, "orders", FLOWSHM_PRODUCER, &p),
		 -EPROTO);
	CHECK_RC(attach_with(&fk, SILENT_CLOSE, "orders", FLOWSHM_PRODUCER,
			     &p), -ECONNRESET);
	CHECK(p == NULL);

	close(fk.ring_fd);
	close(fk.listen_fd);
	unlink(path);

	/* a moverd that accepts nothing (stopped) with its backlog full:
	 * the attach gives up (it blocked in connect() before) */
	{
		int full = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), n = 0;
		int waiting[64];

		CHECK(bind(full, (struct sockaddr *)&sa, sizeof(sa)) == 0);
		CHECK(listen(full, 0) == 0);
		for (; n < 64; n++) {
			waiting[n] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC |
					    SOCK_NONBLOCK, 0);
			if (connect(waiting[n], (struct sockaddr *)&sa,
				    sizeof(sa)) < 0) {
				CHECK(errno == EAGAIN);
				close(waiting[n]);
				break;
			}
		}
		CHECK(n < 64);
		alarm(60); /* guards the run against the old hang */
		CHECK_RC(flowshm_attach("f", FLOWSHM_PRODUCER, NULL, &p),
			 -ETIMEDOUT);
		alarm(0);
		CHECK(strstr(flowshm_attach_error(), "did not accept"));
		printf("backlog full (%d waiting): %s\n", n,
		       flowshm_attach_error());
		while (n--)
			close(waiting[n]);
		close(full);
		unlink(path);
	}
	rmdir(dir);
	printf("test_attach: ok\n");
	return 0;
}
