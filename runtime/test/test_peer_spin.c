/*
** test_peer_spin.c: an idle scheduler spins briefly for a busy peer's
** post instead of sleeping (sched.c, spin_for_peers), and never spins
** when no peer is busy.
**
** pingpong: two tasks on two schedulers pass a counter back and forth
** through two unbuffered channels. Every message crosses threads, and
** the receiver's scheduler goes idle while the other runs the sender:
** some of those idle waits must catch the post by spinning (a hit is
** counted by the scheduler). Values are checked, so a spin that lost or
** duplicated a wake-up fails here or hangs at the bounded join.
**
** idle: a fresh runtime, once both schedulers have settled, whose only
** task sleeps in short steps on one scheduler while the other has
** nothing: neither ever finds a busy peer, so no idle wait spins (an idle
** runtime stays at zero CPU).
*/
#include "internal.h"
#include "sync-util.h"

#include <stdint.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
#define __SANITIZE_THREAD__ 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define ROUNDS 5000
#else
#define ROUNDS 20000
#endif

typedef struct pair {
  ums_chan_t *ping, *pong;
} pair_t;

static void *pinger(void *arg) {
  pair_t *p = arg;
  for (int64_t i = 0; i < ROUNDS; i++) {
    int64_t v = i, back = -1;
    CHECK_OK(ums_chan_send(p->ping, &v, UMS_FOREVER));
    CHECK_OK(ums_chan_recv(p->pong, &back, UMS_FOREVER));
    CHECK_EQ(back, i + 1);
  }
  return (void *)(intptr_t)ROUNDS;
}

static void *ponger(void *arg) {
  pair_t *p = arg;
  for (int64_t i = 0; i < ROUNDS; i++) {
    int64_t v = -1;
    CHECK_OK(ums_chan_recv(p->ping, &v, UMS_FOREVER));
    CHECK_EQ(v, i);
    v++;
    CHECK_OK(ums_chan_send(p->pong, &v, UMS_FOREVER));
  }
  return NULL;
}

static uint64_t count(ums_runtime_t *rt, int which) {
  uint64_t n = 0;
  for (int i = 0; i < rt->nsched; i++) {
    ums__counters_t *c = &rt->scheds[i].counters;
    n += atomic_load(which ? &c->peer_spin_hits : &c->peer_spins);
  }
  return n;
}

static void test_pingpong(void) {
  ums_runtime_t *rt = su_runtime(2, 64 * 1024);
  pair_t p = {ums_chan_new(sizeof(int64_t), 0),
              ums_chan_new(sizeof(int64_t), 0)};
  CHECK(p.ping && p.pong);
  ums_task_t b = su_spawn(rt, 1, ponger, &p);
  ums_task_t a = su_spawn(rt, 0, pinger, &p);
  CHECK_EQ((intptr_t)su_join(rt, a), ROUNDS);
  su_join(rt, b);
  uint64_t spins = count(rt, 0), hits = count(rt, 1);
  printf("pingpong: %d round trips, %llu idle spins, %llu hits\n", ROUNDS,
         (unsigned long long)spins, (unsigned long long)hits);
  CHECK(hits > 0);
  CHECK(hits <= spins);
  su_teardown(rt);
  CHECK_OK(ums_chan_delete(p.ping));
  CHECK_OK(ums_chan_delete(p.pong));
}

static void *sleeper(void *arg) {
  (void)arg;
  for (int i = 0; i < 100; i++) CHECK_OK(ums_sleep(2 * MS));
  return NULL;
}

static void test_idle(void) {
  ums_runtime_t *rt = su_runtime(2, 64 * 1024);
  /* Both schedulers start running (each is busy to the other until its
  ** first idle wait): counted from when they have settled. */
  ums_sleep(50 * MS);
  uint64_t before = count(rt, 0);
  ums_task_t t = su_spawn(rt, 0, sleeper, NULL);
  su_join(rt, t);
  /* And with no task at all. */
  ums_sleep(100 * MS);
  CHECK_EQ(count(rt, 0) - before, 0);
  su_teardown(rt);
}

int main(void) {
  test_pingpong();
  test_idle();
  printf("test_peer_spin: ok\n");
  return 0;
}
