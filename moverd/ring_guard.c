/*
 * moverd/ring_guard.c - SIGBUS on a shrunk ring file: see ring_guard.h.
 */
#include "ring_guard.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct guarded {
	uintptr_t start;
	size_t len;
	uint64_t id;
	volatile sig_atomic_t tripped;
};

static struct guarded *guards;
static size_t n_guards, cap_guards;
static uint64_t last_id;
/* guards tripped and not yet asked about: ring_guard_tripped runs for
 * every flow on each round of the checks, and its answer is almost always
 * no; with this it is no without a look through every guard (10 000 flows
 * made that look a third of an idle moverd's CPU) */
static volatile sig_atomic_t n_tripped;

static struct guarded *find(uintptr_t addr)
{
	for (size_t i = 0; i < n_guards; i++)
		if (addr - guards[i].start < guards[i].len)
			return &guards[i];
	return NULL;
}

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
	struct guarded *g = find((uintptr_t)si->si_addr);

	(void)ctx;
	/*
	 * Zero pages in place of the file's: the faulting access is retried
	 * and succeeds, and the flow is failed on the next check.  mmap is a
	 * plain system call, safe here.
	 */
	if (g && mmap((void *)g->start, g->len, PROT_READ | PROT_WRITE,
		      MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		      -1, 0) != MAP_FAILED) {
		if (!g->tripped)
			n_tripped = n_tripped + 1;
		g->tripped = 1;
		return;
	}
	/* not a ring: the default action once the access is retried */
	signal(sig, SIG_DFL);
}

int ring_guard_init(void)
{
	struct sigaction sa = { .sa_sigaction = on_sigbus,
				.sa_flags = SA_SIGINFO };

	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL) ? -errno : 0;
}

/* Entry i goes (the last takes its place). */
static void drop_at(size_t i)
{
	if (guards[i].tripped)
		n_tripped = n_tripped - 1;
	guards[i] = guards[--n_guards];
}

/* Forget entries overlapping [start, start + len): a mapping unmapped
 * without its guard removed first, whose addresses are reused. */
static void drop_overlaps(uintptr_t start, size_t len)
{
	for (size_t i = 0; i < n_guards;) {
		if (guards[i].start < start + len &&
		    start < guards[i].start + guards[i].len)
			drop_at(i);
		else
			i++;
	}
}

uint64_t ring_guard_add(void *addr, size_t len)
{
	drop_overlaps((uintptr_t)addr, len);
	if (n_guards == cap_guards) {
		size_t cap = cap_guards ? 2 * cap_guards : 64;
		struct guarded *g = malloc(cap * sizeof(*g)), *old = guards;

		if (!g)
			return 0;
		/* a copy, not realloc: the array stays whole for the handler
		 * until the pointer store */
		if (n_guards)
			memcpy(g, guards, n_guards * sizeof(*g));
		guards = g;
		cap_guards = cap;
		free(old);
	}
	guards[n_guards++] = (struct guarded){ (uintptr_t)addr, len, ++last_id,
					       0 };
	return last_id;
}

/* The index of id's entry, or n_guards. */
static size_t by_id(uint64_t id)
{
	size_t i = 0;

	while (id && i < n_guards && guards[i].id != id)
		i++;
	return id ? i : n_guards;
}

void ring_guard_remove(uint64_t id)
{
	size_t i = by_id(id);

	if (i < n_guards)
		drop_at(i);
}

bool ring_guard_tripped(uint64_t id)
{
	size_t i;

	if (!n_tripped)
		return false;
	i = by_id(id);
	if (i == n_guards || !guards[i].tripped)
		return false;
	guards[i].tripped = 0; /* replaced once: it cannot fault again */
	n_tripped = n_tripped - 1;
	return true;
}

bool ring_guard_any(void)
{
	return n_tripped != 0;
}
