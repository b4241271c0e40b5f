/*
** stats_pingpong: two C tasks of one scheduler passing N messages through
** unbuffered channels, for bench/lua/stats_cost.sh, which counts its
** instructions under callgrind with UMS_STATS=off, on and precise (the
** runtime's default reads the variable). Not a timing benchmark: see
** bench_core's chan_same_stats_off for time.
**
**   stats_pingpong N      (N messages, N/2 round trips)
*/
#include "ums.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct pingpong {
  ums_chan_t *ab, *ba;
  long rounds;
} pingpong_t;

static void check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "stats_pingpong: %s: %s\n", what, ums_strerror(rc));
    exit(1);
  }
}

static void *ping(void *arg) {
  pingpong_t *p = arg;
  int v = 1;
  for (long i = 0; i < p->rounds; i++) {
    check(ums_chan_send(p->ab, &v, UMS_FOREVER), "send");
    check(ums_chan_recv(p->ba, &v, UMS_FOREVER), "recv");
  }
  v = 0;
  check(ums_chan_send(p->ab, &v, UMS_FOREVER), "send");
  return NULL;
}

static void *pong(void *arg) {
  pingpong_t *p = arg;
  for (;;) {
    int v;
    check(ums_chan_recv(p->ab, &v, UMS_FOREVER), "recv");
    if (!v) return NULL;
    check(ums_chan_send(p->ba, &v, UMS_FOREVER), "send");
  }
}

int main(int argc, char **argv) {
  long n = argc > 1 ? strtol(argv[1], NULL, 10) : 0;
  if (argc != 2 || n < 2) {
    fprintf(stderr, "usage: stats_pingpong N (messages, N >= 2)\n");
    return 2;
  }
  /* No stall detection: only the stats choose whether the monitor runs. */
  ums_config_t cfg = {.schedulers = 1, .stall_threshold = -1};
  int err = 0;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (!rt) check(err, "ums_runtime_new");
  pingpong_t p = {ums_chan_new(sizeof(int), 0), ums_chan_new(sizeof(int), 0),
                  n / 2};
  if (!p.ab || !p.ba) check(UMS_ENOMEM, "ums_chan_new");
  ums_spawn_opts_t o = {.sched = 0};
  ums_task_t a, b;
  check(ums_task_spawn(rt, &o, ping, &p, &a), "spawn");
  check(ums_task_spawn(rt, &o, pong, &p, &b), "spawn");
  check(ums_task_join(rt, a, UMS_FOREVER, NULL, NULL), "join");
  check(ums_task_join(rt, b, UMS_FOREVER, NULL, NULL), "join");
  check(ums_runtime_shutdown(rt, UMS_FOREVER), "shutdown");
  ums_chan_delete(p.ab);
  ums_chan_delete(p.ba);
  return 0;
}
