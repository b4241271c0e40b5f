/*
** test_parked.c: 100,000 C tasks parked at once, each on its own 64 KiB
** fiber stack. Their stacks, with guard pages, must fit in far fewer
** mappings than the kernel's default limit of 65,530 (vm.max_map_count),
** which a mapping per stack plus one per guard would blow through. Then
** they all wake, end and are joined, and the runtime shuts down clean.
**
** The ASan build parks all 100,000 too (about 2 s and 1.3 GB resident
** here). TSan registers every fiber as a thread, dies beyond 8,128 of
** them and maps several regions of its own per fiber (5,000 fibers: 30,000
** mappings, 4 GB), so the TSan build parks 2,000 and does not count
** mappings: what it would count is TSan's.
*/
#include "test-util.h"

#include <stdatomic.h>

#ifndef NTASKS
#if defined(__SANITIZE_THREAD__)
#define NTASKS 2000
#else
#define NTASKS 100000
#endif
#endif
#define NSCHED 2
#define MAX_MAP_COUNT 65530

static ums_event_t *go;
static atomic_int parked;
static ums_task_t tasks[NTASKS];

static void *park_fn(void *arg) {
  atomic_fetch_add(&parked, 1);
  int rc = ums_event_wait(go, UMS_FOREVER);
  return rc == 0 ? arg : NULL;
}

static int map_count(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  CHECK(f != NULL);
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

static bool all_idle(ums_runtime_t *rt) {
  for (int s = 0; s < NSCHED; s++)
    if (!tu_stats(rt, s).idle) return false;
  return true;
}

static void test_parked(void) {
  int maps_before = map_count();
  ums_config_t cfg = {.schedulers = NSCHED, .stack_size = 64 * 1024};
  ums_runtime_t *rt = tu_runtime_new_cfg(&cfg);
  go = ums_event_new(1, 0);
  CHECK(go != NULL);

  int64_t start = ums_now();
  for (int i = 0; i < NTASKS; i++)
    CHECK_RC(ums_task_spawn(rt, NULL, park_fn, (void *)(uintptr_t)(i + 1),
                            &tasks[i]),
             0);
  /* Every task counted itself, and a scheduler idles only once all of
  ** its tasks have parked. */
  WAIT_UNTIL(atomic_load(&parked) == NTASKS && all_idle(rt), 60000);
  printf("   %d tasks parked in %" PRId64 " ms\n", NTASKS,
         tu_elapsed_ms(start));

  CHECK_EQ(tu_stats_sum(rt, tasks), NTASKS);
  CHECK_EQ(tu_stats_sum(rt, workers_active), NTASKS);
  CHECK_EQ(tu_stats_sum(rt, pending), 0);
  CHECK_EQ(tu_stats_sum(rt, runnable), 0);
  /* Placement spread them over both schedulers. */
  for (int s = 0; s < NSCHED; s++)
    CHECK_GE(tu_stats(rt, s).tasks, NTASKS / NSCHED / 2);

  int maps = map_count();
  printf("   /proc/self/maps: %d lines (%d before the runtime)\n", maps,
         maps_before);
#if !defined(__SANITIZE_THREAD__)
  /* A few hundred slabs at most; a mapping per stack and one per guard
  ** would be 2 * NTASKS. */
  CHECK_LT(maps, MAX_MAP_COUNT / 10);
  CHECK_LT(maps - maps_before, NTASKS / 20);
#endif

  CHECK_RC(ums_event_set(go), 0);
  for (int i = 0; i < NTASKS; i++) {
    void *res = NULL;
    int status = 1;
    CHECK_RC(ums_task_join(rt, tasks[i], UMS_FOREVER, &res, &status), 0);
    CHECK_PTR_EQ(res, (void *)(uintptr_t)(i + 1));
    CHECK_RC(status, 0);
  }
  WAIT_UNTIL(tu_stats_sum(rt, tasks) == 0, 10000);
  CHECK_RC(ums_event_delete(go), 0);
  tu_runtime_shutdown(rt);
}

int main(void) {
  RUN(test_parked);
  return 0;
}
