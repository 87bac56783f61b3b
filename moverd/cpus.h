/*
 * moverd/cpus.h - CPU lists as taskset(1) and /proc's Cpus_allowed_list
 * write them ("0", "2-3", "0,2-3"), for moverd --cpus and flowbench.
 */
#ifndef MOVERD_CPUS_H
#define MOVERD_CPUS_H

#include <sched.h> /* cpu_set_t: moverd builds with _GNU_SOURCE */

/* Parse LIST into *set: comma-separated CPUs and ranges, no blanks, each
 * below CPU_SETSIZE.  0, or -1 if LIST is not such a list (or empty). */
int cpus_parse(const char *list, cpu_set_t *set);

#endif
