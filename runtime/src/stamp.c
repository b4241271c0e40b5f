/*
** stamp.c: the stamp clock, monotonic nanoseconds cheap enough to read
** on the switch path (wait statistics, waitstats.c).
**
** clock_gettime reads the time stamp counter underneath and does more
** besides, so reading the counter directly costs a fraction of it. The
** counter's rate is not published to user space on x86-64, so it is
** measured: the first reading takes an anchor (counter,
** CLOCK_MONOTONIC), and the first reading at least
** CALIBRATE_NS later a second pair; their ratio gives the rate, and from
** then on a stamp is the anchor's time plus the scaled counter delta.
** Until then stamps come from clock_gettime, which agrees with the scaled
** counter at the second pair by construction. The error of the rate is
** the clock's jitter over the interval (well under 1e-5), and only
** differences of stamps are used.
**
** The counter is used only where it is trustworthy: on x86-64 when the
** kernel itself uses it as its clocksource (then it is invariant and
** synchronised across CPUs, or the kernel would not), on aarch64 always
** (the generic timer is architecturally synchronised, and its frequency
** register gives the rate without measuring).
*/
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALIBRATE_NS (100 * UMS_NSEC_PER_MSEC)

ums__stamp_clock_t ums__stamp;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool usable;                 /* [const after once] */
static uint64_t anchor_ticks;       /* [const after once] */
static int64_t anchor_ns;           /* [const after once] */
static _Atomic int calibrating;     /* one thread computes the rate */

/* A (counter, clock) pair read as close together as possible: the clock
** readings bracket the counter's, and their midpoint is kept. */
static void read_pair(uint64_t *ticks, int64_t *ns) {
  int64_t a = ums__clock_real();
  *ticks = ums__stamp_ticks();
  int64_t b = ums__clock_real();
  *ns = a + (b - a) / 2;
}

static bool counter_trusted(void) {
  const char *env = getenv("UMS_STAMP_CLOCK");
  if (env && strcmp(env, "gettime") == 0) return false;
#if defined(__x86_64__)
  char buf[32] = {0};
  FILE *f = fopen(
      "/sys/devices/system/clocksource/clocksource0/current_clocksource",
      "r");
  if (!f) return false;
  bool ok = fgets(buf, sizeof buf, f) && strcmp(buf, "tsc\n") == 0;
  fclose(f);
  return ok;
#elif defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

static void publish(uint64_t mult) {
  ums__stamp.tsc0 = anchor_ticks;
  ums__stamp.ns0 = anchor_ns;
  ums__stamp.mult = mult;
  atomic_store_explicit(&ums__stamp.ready, 1, memory_order_release);
}

static void init(void) {
  usable = counter_trusted();
  if (!usable) return;
  read_pair(&anchor_ticks, &anchor_ns);
#if defined(__aarch64__)
  uint64_t freq;
  __asm__ __volatile__("mrs %0, cntfrq_el0" : "=r"(freq));
  if (freq) {
    publish((uint64_t)(((unsigned __int128)UMS_NSEC_PER_SEC << 32) / freq));
    return;
  }
#endif
}

int64_t ums__stamp_slow(void) {
  pthread_once(&once, init);
  /* Real time, also on a scheduler thread of a virtual-clock runtime. */
  int64_t now = ums__clock_real();
  if (!usable || now - anchor_ns < CALIBRATE_NS ||
      atomic_load_explicit(&calibrating, memory_order_relaxed) ||
      atomic_exchange(&calibrating, 1))
    return now;
  uint64_t ticks;
  int64_t ns;
  read_pair(&ticks, &ns);
  if (ticks > anchor_ticks) {
    unsigned __int128 mult =
        ((unsigned __int128)(uint64_t)(ns - anchor_ns) << 32) /
        (ticks - anchor_ticks);
    /* A rate of 2^32 ns per tick or more is no counter worth having. */
    if (mult > 0 && mult < ((unsigned __int128)1 << 64))
      publish((uint64_t)mult);
  }
  return ns;
}
