/*
 * ipc/lattrace.c - the timestamp trail (lattrace.h).  One array per
 * process, written by one thread (moverd's loop, a flowbench client): a
 * mark from another thread may be lost or torn, which a trace tolerates.
 */
#include "lattrace.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct fmlt_entry {
	uint64_t ns;
	uint64_t arg;
	uint32_t ev;
};

int fmlt_on;
static struct fmlt_entry *trail;
static unsigned used;
static char who_[32];

void fmlt_mark_(enum lt_event ev, uint64_t arg)
{
	struct timespec ts;

	if (used >= LT_MAX)
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	trail[used++] = (struct fmlt_entry){
		.ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
		.arg = arg, .ev = ev,
	};
}

void fmlt_init(const char *who)
{
	if (!getenv("FM_LATTRACE") || fmlt_on)
		return;
	snprintf(who_, sizeof(who_), "%s", who);
	trail = calloc(LT_MAX, sizeof(*trail));
	used = 0;
	fmlt_on = trail != NULL;
}

void fmlt_dump(void)
{
	const char *dir = getenv("FM_LATTRACE");
	char path[4096];
	FILE *f;

	if (!fmlt_on || !dir)
		return;
	snprintf(path, sizeof(path), "%s/%s.%d", dir, who_, (int)getpid());
	f = fopen(path, "w");
	if (!f)
		return;
	for (unsigned i = 0; i < used; i++)
		fprintf(f, "%llu %u %s %llu\n", (unsigned long long)trail[i].ns,
			trail[i].ev, who_, (unsigned long long)trail[i].arg);
	fclose(f);
}
