/*
** test_oom.c: tasks the runtime cannot start or continue for lack of
** memory end with UMS_ENOMEM, which their joiner sees; a step task is
** stepped once more with ums_step_error() saying so, never dropped.
**
**   stacks: the address space is limited (RLIMIT_AS) so that only some
**     worker stacks can be mapped; tasks that each hold their worker
**     (C tasks, and step tasks waiting inside their step) are spawned
**     past that. Not under the sanitizers, which reserve terabytes of
**     address space.
**   timer: the timer-heap reserve taken when a task is admitted fails
**     (realloc made to fail by the failalloc preload, see
**     fault/failalloc.c). Runs only with --timer, which ctest passes
**     with the preload in place; without the preload that is an error.
*/
#include "internal.h"
#include "test-util.h"

#include <stdatomic.h>
#include <sys/resource.h>

#if defined(__SANITIZE_ADDRESS__) || defined(TU_TSAN)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif

#define NTASKS 48
#define STACK (32u << 20)

static ums_event_t *gate;
static atomic_int ran, step_errors, steps_run;

static void *hold_worker(void *arg) {
  (void)arg;
  atomic_fetch_add(&ran, 1);
  CHECK_RC(ums_event_wait(gate, UMS_FOREVER), 0);
  return (void *)1;
}

/* A step task that waits inside its step, so it keeps the worker it runs
** on (as a Lua task waiting inside table.sort's comparator does). */
static int hold_step(void *arg) {
  (void)arg;
  atomic_fetch_add(&steps_run, 1);
  int err = ums_step_error();
  if (err) {
    CHECK_RC(err, UMS_ENOMEM);
    /* Nothing may wait in this step: it is not on a stack of its own. */
    CHECK_RC(ums_sleep(0), UMS_ENOMEM);
    ums_park_token_t tok;
    CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), UMS_ENOMEM);
    CHECK_RC(ums_yield(), UMS_ENOMEM);
    atomic_fetch_add(&step_errors, 1);
    return UMS_STEP_DONE;
  }
  CHECK_RC(ums_event_wait(gate, UMS_FOREVER), 0);
  ums_step_set_result((void *)2, 0);
  return UMS_STEP_DONE;
}

static size_t vm_size(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  CHECK(f != NULL);
  unsigned long pages = 0;
  CHECK_EQ(fscanf(f, "%lu", &pages), 1);
  fclose(f);
  return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}

static void test_stacks(void) {
#ifdef SANITIZED
  printf("test_stacks: skipped (the sanitizers reserve terabytes of "
         "address space: RLIMIT_AS cannot be used)\n");
  return;
#else
  ums_config_t cfg = {.schedulers = 1, .stack_size = STACK};
  ums_runtime_t *rt = tu_runtime_new_cfg(&cfg);
  gate = ums_event_new(1, 0);
  CHECK(gate != NULL);
  /* Warm up: the task table, the timer heap and the scheduler's malloc
  ** arena exist before the limit. */
  ums_task_t w = tu_spawn_named_at(__FILE__, __LINE__, rt, 0, "warm",
                                   hold_worker, NULL);
  WAIT_UNTIL(atomic_load(&ran) == 1, 10000);
  CHECK_RC(ums_event_set(gate), 0);
  tu_join_ok_at(__FILE__, __LINE__, rt, w);
  CHECK_RC(ums_event_reset(gate), 0);
  atomic_store(&ran, 0);

  struct rlimit old;
  CHECK_EQ(getrlimit(RLIMIT_AS, &old), 0);
  /* Room for a few stacks only. */
  struct rlimit lim = {vm_size() + 8 * (size_t)STACK, old.rlim_max};
  CHECK_EQ(setrlimit(RLIMIT_AS, &lim), 0);

  ums_task_t c[NTASKS], st[NTASKS];
  for (int i = 0; i < NTASKS; i++) {
    ums_spawn_opts_t o = {.sched = 0};
    CHECK_RC(ums_task_spawn(rt, &o, hold_worker, NULL, &c[i]), 0);
    CHECK_RC(ums_task_spawn_step(rt, &o, hold_step, NULL, &st[i]), 0);
  }
  /* Every task has either reached its wait or been ended. */
  WAIT_UNTIL(atomic_load(&ran) + atomic_load(&steps_run) >= NTASKS, 20000);
  usleep(100 * 1000);
  CHECK_RC(ums_event_set(gate), 0);
  int ok = 0, nomem = 0, step_ok = 0, step_nomem = 0;
  for (int i = 0; i < NTASKS; i++) {
    void *res = NULL;
    int status = 1;
    CHECK_RC(ums_task_join(rt, c[i], ums_deadline(20 * UMS_NSEC_PER_SEC),
                           &res, &status),
             0);
    if (status == 0) {
      CHECK_PTR_EQ(res, (void *)1);
      ok++;
    } else {
      CHECK_RC(status, UMS_ENOMEM);
      nomem++;
    }
    status = 1;
    CHECK_RC(ums_task_join(rt, st[i], ums_deadline(20 * UMS_NSEC_PER_SEC),
                           &res, &status),
             0);
    if (status == 0) {
      CHECK_PTR_EQ(res, (void *)2);
      step_ok++;
    } else {
      CHECK_RC(status, UMS_ENOMEM);
      step_nomem++;
    }
  }
  CHECK_EQ(setrlimit(RLIMIT_AS, &old), 0);
  printf("test_stacks: C tasks %d ok, %d out of memory; step tasks %d ok, "
         "%d out of memory\n", ok, nomem, step_ok, step_nomem);
  CHECK_GT(ok + step_ok, 0);
  CHECK_GT(nomem + step_nomem, 0);
  CHECK_EQ(ok, atomic_load(&ran));
  /* Each step task that could not run was told, exactly once. */
  CHECK_EQ(step_nomem, atomic_load(&step_errors));
  CHECK_EQ(atomic_load(&steps_run), NTASKS);
  ums_event_delete(gate);
  tu_runtime_shutdown(rt);
#endif
}

static void *never_runs(void *arg) {
  (void)arg;
  atomic_fetch_add(&ran, 1);
  return NULL;
}

static void test_timer_reserve(void) {
  ums_runtime_t *rt = tu_runtime_new(1);
  atomic_store(&ran, 0);
  atomic_store(&step_errors, 0);
  atomic_store(&steps_run, 0);
  gate = ums_event_new(1, 1);
  CHECK(gate != NULL);
  /* The runtime's first tasks reserve its first timer slots. */
  const char *armed = getenv("FAILALLOC_ARM");
  if (!armed) tu_fail(__FILE__, __LINE__, "--timer needs the failalloc "
                      "preload (LD_PRELOAD=libfailalloc.so)");
  ums_spawn_opts_t o = {.sched = 0};
  ums_task_t c, st;
  CHECK_RC(ums_task_spawn(rt, &o, never_runs, NULL, &c), 0);
  CHECK_RC(ums_task_spawn_step(rt, &o, hold_step, NULL, &st), 0);
  int status = 1;
  CHECK_RC(ums_task_join(rt, c, ums_deadline(20 * UMS_NSEC_PER_SEC), NULL,
                         &status),
           0);
  CHECK_RC(status, UMS_ENOMEM);
  status = 1;
  CHECK_RC(ums_task_join(rt, st, ums_deadline(20 * UMS_NSEC_PER_SEC), NULL,
                         &status),
           0);
  CHECK_RC(status, UMS_ENOMEM);
  CHECK(getenv("FAILALLOC_DISARM") != NULL);
  CHECK_EQ(atomic_load(&ran), 0);
  CHECK_EQ(atomic_load(&steps_run), 1);
  CHECK_EQ(atomic_load(&step_errors), 1);
  /* Memory back: the scheduler runs tasks again. */
  tu_join_ok_at(__FILE__, __LINE__, rt,
                tu_spawn_named_at(__FILE__, __LINE__, rt, 0, "after",
                                  hold_worker, NULL));
  ums_event_delete(gate);
  tu_runtime_shutdown(rt);
  printf("test_timer_reserve: ok\n");
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--timer") == 0) {
    test_timer_reserve();
    return 0;
  }
  test_stacks();
  return 0;
}
