/*
** stress_pingpong.c: 100,000 tasks alive at once doing channel ping-pong,
** on 1, 2 and 4 schedulers (a fresh runtime each, 64 KiB stacks).
**
** 50,000 pairs; each pair owns two unbuffered channels. The pinger sends
** a value, the ponger answers value + 1, for ROUNDS round trips; then the
** pinger closes its channel and the ponger, which receives until
** UMS_ECLOSED, ends. The pingers first wait on one manual-reset event,
** set only once every one of the 100,000 tasks has started (has a worker
** of its own) and parked, so all of them are alive at the same time.
** With more than one scheduler the two tasks of a pair sit on different
** schedulers, so every message crosses threads. Every
** task is accounted for: an atomic count of completions, each pair's
** final value and round count, and a join of every task, whose result is
** checked too.
**
** Under ASan the program scales down to 20,000 tasks (10,000 pairs): the
** fake stacks and shadow memory make 100,000 fibers slow and memory-hungry
** without finding anything more. Under TSan it scales down further, to
** 4,000 tasks (2,000 pairs): TSan counts every live fiber as a thread,
** dies past 8,128 of them, and needs over 1 MB of its own per fiber.
*/
#include "internal.h"
#include "sync-util.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(__SANITIZE_THREAD__)
#define __SANITIZE_THREAD__ 1
#endif
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define SANITIZER "TSan"
#define TASKS 4000
#elif defined(__SANITIZE_ADDRESS__)
#define SANITIZER "ASan"
#define TASKS 20000
#else
#define SANITIZER ""
#define TASKS 100000
#endif
#define PAIRS (TASKS / 2)
#define ROUNDS 4

typedef struct pair {
  ums_chan_t *ping, *pong;
  int64_t final; /* written by the pinger */
  int rounds;    /* written by the ponger */
} pair_t;

static pair_t *pairs;
static _Atomic long completed;
static ums_event_t *go;

static void *pinger(void *arg) {
  pair_t *p = arg;
  int64_t idx = p - pairs, v = idx * 10;
  CHECK_OK(ums_event_wait(go, UMS_FOREVER));
  for (int r = 0; r < ROUNDS; r++) {
    int64_t reply = -1;
    CHECK_OK(ums_chan_send(p->ping, &v, UMS_FOREVER));
    CHECK_OK(ums_chan_recv(p->pong, &reply, UMS_FOREVER));
    CHECK_EQ(reply, v + 1);
    v = reply + 1;
  }
  CHECK_OK(ums_chan_close(p->ping));
  p->final = v;
  atomic_fetch_add(&completed, 1);
  return (void *)p;
}

static void *ponger(void *arg) {
  pair_t *p = arg;
  int64_t v;
  int r;
  while ((r = ums_chan_recv(p->ping, &v, UMS_FOREVER)) == 0) {
    v += 1;
    CHECK_OK(ums_chan_send(p->pong, &v, UMS_FOREVER));
    p->rounds++;
  }
  CHECK_EQ(r, UMS_ECLOSED);
  atomic_fetch_add(&completed, 1);
  return (void *)(p + PAIRS); /* distinct from the pinger's */
}

static double run(int nsched) {
  int64_t t0 = ums_now();
  ums_runtime_t *rt = su_runtime(nsched, 64 * 1024);
  ums_config_t cfg;
  ums_runtime_config(rt, &cfg);
  CHECK_EQ(cfg.stack_size, 64 * 1024);

  pairs = calloc(PAIRS, sizeof *pairs);
  ums_task_t *ping_t = calloc(PAIRS, sizeof *ping_t);
  ums_task_t *pong_t = calloc(PAIRS, sizeof *pong_t);
  CHECK(pairs && ping_t && pong_t);
  atomic_store(&completed, 0);
  go = ums_event_new(1, 0);
  CHECK(go != NULL);
  for (int i = 0; i < PAIRS; i++) {
    pairs[i].ping = ums_chan_new(sizeof(int64_t), 0);
    pairs[i].pong = ums_chan_new(sizeof(int64_t), 0);
    CHECK(pairs[i].ping && pairs[i].pong);
  }
  /* Pongers first: all 50,000 of them park in recv, so the pingers find
  ** them waiting; the pair's partner is on the next scheduler. */
  for (int i = 0; i < PAIRS; i++)
    pong_t[i] = su_spawn(rt, (i + 1) % nsched, ponger, &pairs[i]);
  for (int i = 0; i < PAIRS; i++)
    ping_t[i] = su_spawn(rt, i % nsched, pinger, &pairs[i]);
  int64_t t_spawned = ums_now();

  /* Every task started and parked: each holds a worker (and a stack). */
  ums_sched_stats_t rows[4];
  uint64_t active = 0;
  int64_t give_up = ums_deadline(60 * UMS_NSEC_PER_SEC);
  for (;;) {
    uint64_t runnable = 0;
    active = 0;
    CHECK_EQ(ums_runtime_stats(rt, rows, 4), nsched);
    for (int i = 0; i < nsched; i++) {
      active += rows[i].workers_active;
      runnable += rows[i].runnable;
      CHECK(rows[i].tasks <= TASKS);
    }
    if (active == TASKS && runnable == 0) break;
    CHECK(ums_now() < give_up);
    ums_sleep(2 * MS);
  }
  CHECK_EQ(atomic_load(&completed), 0);
  int64_t t_parked = ums_now();
  CHECK_OK(ums_event_set(go));

  for (int i = 0; i < PAIRS; i++) {
    void *res = NULL;
    int status = -1;
    CHECK_OK(ums_task_join(rt, ping_t[i], UMS_FOREVER, &res, &status));
    CHECK_EQ(status, 0);
    CHECK(res == &pairs[i]);
    CHECK_OK(ums_task_join(rt, pong_t[i], UMS_FOREVER, &res, &status));
    CHECK_EQ(status, 0);
    CHECK(res == &pairs[i] + PAIRS);
  }
  CHECK_EQ(atomic_load(&completed), TASKS);
  CHECK_OK(ums_event_delete(go));
  for (int i = 0; i < PAIRS; i++) {
    CHECK_EQ(pairs[i].final, (int64_t)i * 10 + 2 * ROUNDS);
    CHECK_EQ(pairs[i].rounds, ROUNDS);
    CHECK_EQ(ums_chan_len(pairs[i].ping), 0);
    CHECK_OK(ums_chan_delete(pairs[i].ping));
    CHECK_OK(ums_chan_delete(pairs[i].pong));
  }
  free(pairs);
  free(ping_t);
  free(pong_t);
  su_teardown(rt);
  double secs = (double)(ums_now() - t0) / 1e9;
  printf("  %d scheduler%s: %d tasks, %d round trips per pair: spawned "
         "%.2f s, all parked %.2f s, done and torn down %.2f s\n",
         nsched, nsched > 1 ? "s" : " ", TASKS, ROUNDS,
         (double)(t_spawned - t0) / 1e9, (double)(t_parked - t0) / 1e9, secs);
  fflush(stdout);
  return secs;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (SANITIZER[0])
    printf("stress_pingpong: %d tasks (%s build: scaled down from "
           "100,000), 64 KiB stacks\n",
           TASKS, SANITIZER);
  else
    printf("stress_pingpong: %d tasks, 64 KiB stacks\n", TASKS);
  double total = 0;
  total += run(1);
  total += run(2);
  total += run(4);
  printf("stress_pingpong: ok (%.2f s)\n", total);
  return 0;
}
