/*
** fixed_time.c: an LD_PRELOAD library whose time() always answers the
** same second, for instruction counts that repeat (stats_cost.sh).
**
** Lua 5.4 seeds its string hashes from time(NULL) and a few addresses
** (lstate.c, luai_makeseed), so every process hashes differently, and
** table lookups cost a different number of instructions from run to run:
** +-1% of a channel benchmark under callgrind, as much as what
** stats_cost.sh measures. Under valgrind the addresses repeat when the
** environment does (its size moves the stack), so with time() fixed the
** seed, and the count, repeat.
*/
#include <time.h>

time_t time(time_t *t) {
  if (t) *t = 1700000000;
  return 1700000000;
}
