/*
 * moverd/cpus.c - parse a CPU list (cpus.h).
 */
#include "cpus.h"

#include <stdlib.h>

/* One CPU number at *s; -1 if there is none or it is out of range. */
static long cpu_number(const char **s)
{
	char *end;
	long v;

	if (**s < '0' || **s > '9')
		return -1;
	v = strtol(*s, &end, 10);
	*s = end;
	return v < CPU_SETSIZE ? v : -1;
}

int cpus_parse(const char *list, cpu_set_t *set)
{
	const char *s = list;

	CPU_ZERO(set);
	for (;;) {
		long lo = cpu_number(&s), hi = lo;

		if (lo < 0)
			return -1;
		if (*s == '-') {
			s++;
			hi = cpu_number(&s);
			if (hi < lo)
				return -1;
		}
		for (long c = lo; c <= hi; c++)
			CPU_SET((int)c, set);
		if (!*s)
			return 0;
		if (*s++ != ',')
			return -1;
	}
}
