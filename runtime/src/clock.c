/*
** clock.c: the monotonic clock (real or virtual), futex waits and the
** spinlock's slow path. Everything here is a thin layer over the kernel;
** it exists so the rest of the runtime speaks in absolute monotonic
** nanoseconds.
**
** The virtual clock (ums.h, "Virtual clock") is one number per runtime.
** Its runtime has a single scheduler, whose thread alone moves it
** (sched.c's idle wait, when nothing can run), so it needs no lock; it is
** atomic only because ums_runtime_now() may read it from other threads.
** The choice between the clocks is made per thread: code running on a
** virtual runtime's scheduler thread (its tasks, its pass) reads virtual
** time, every other thread reads real time. That keeps the real clock for
** what really waits (pool threads, host threads' futex deadlines, the Lua
** binding's quantum monitor) without passing a runtime to every reading.
*/
#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int64_t ums__clock_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * UMS_NSEC_PER_SEC + ts.tv_nsec;
}

int64_t ums__clock_now(void) {
  ums__sched_t *s = ums__tls_sched;
  if (!s) return ums__clock_real();
  int64_t now = UMS__UNLIKELY(s->rt->vclock)
                    ? atomic_load_explicit(&s->rt->vnow, memory_order_relaxed)
                    : ums__clock_real();
  s->clock_seen = now;
  return now;
}

void ums__clock_advance(ums_runtime_t *rt, int64_t to) {
  if (to > atomic_load_explicit(&rt->vnow, memory_order_relaxed))
    atomic_store_explicit(&rt->vnow, to, memory_order_relaxed);
}

int64_t ums_now(void) { return ums__clock_now(); }

int64_t ums_runtime_now(const ums_runtime_t *rt) {
  if (rt && rt->vclock)
    return atomic_load_explicit(&rt->vnow, memory_order_relaxed);
  return ums__clock_real();
}

int64_t ums_deadline(int64_t ns) {
  if (ns < 0) return UMS_FOREVER;
  int64_t now = ums__clock_now();
  if (ns > UMS_FOREVER - now) return UMS_FOREVER;
  return now + ns;
}

/* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout, which is
** what every caller has; FUTEX_WAIT would need a fresh relative one. */
int ums__futex_wait(_Atomic uint32_t *addr, uint32_t expected,
                    int64_t deadline) {
  struct timespec ts, *tsp = NULL;
  if (deadline != UMS_FOREVER) {
    if (deadline < 0) deadline = 0;
    ts.tv_sec = deadline / UMS_NSEC_PER_SEC;
    ts.tv_nsec = deadline % UMS_NSEC_PER_SEC;
    tsp = &ts;
  }
  long r = syscall(SYS_futex, (uint32_t *)addr,
                   FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, expected, tsp,
                   NULL, FUTEX_BITSET_MATCH_ANY);
  return r == 0 ? 0 : -errno;
}

void ums__futex_wake(_Atomic uint32_t *addr, int n) {
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, n,
          NULL, NULL, 0);
}

void ums__lock_slow(ums__lock_t *l) {
  for (unsigned spins = 0;; spins++) {
    while (atomic_load_explicit(&l->locked, memory_order_relaxed)) {
      if (spins++ < 128) {
        ums__cpu_relax();
      } else {
        /* The holder is probably preempted; let it run. */
        sched_yield();
      }
    }
    if (!atomic_exchange_explicit(&l->locked, 1, memory_order_acquire))
      return;
  }
}
