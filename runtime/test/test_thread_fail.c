/*
** test_thread_fail.c: ums_runtime_new when a scheduler thread cannot be
** created. The failure is injected from outside: ctest runs this program
** a second time as "thread_create_failure" under
**   strace -f -e inject=clone3:error=EAGAIN:when=2+ ... --expect-failure
** so that the first thread starts and a later one fails. The runtime must
** then return NULL with UMS_EAGAIN (or UMS_ENOMEM), without crashing or
** hanging, and must have joined the threads it had already started.
**
** Without --expect-failure it is an ordinary test of the same path when
** nothing fails.
*/
#include "test-util.h"

#define NSCHED 4

static void *return_arg(void *arg) { return arg; }

int main(int argc, char **argv) {
  bool expect_failure = argc > 1 && strcmp(argv[1], "--expect-failure") == 0;
  if (argc > 1 && !expect_failure) {
    fprintf(stderr, "usage: %s [--expect-failure]\n", argv[0]);
    return 2;
  }
  /* With the injection, no thread may be created before ums_runtime_new:
  ** it counts clone calls from the start of the program. Without it, the
  ** baseline helper first lets a sanitizer start its own helper thread. */
  int before = expect_failure ? tu_thread_count() : tu_thread_baseline();
  if (expect_failure) CHECK_EQ(before, 1);

  ums_config_t cfg = {.schedulers = NSCHED};
  int err = 1;
  int64_t start = ums_now();
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  CHECK_LT(tu_elapsed_ms(start), 10000);

  if (expect_failure) {
    if (rt != NULL)
      tu_fail(__FILE__, __LINE__,
              "ums_runtime_new succeeded although "
              "thread creation was to fail (is the injection working?)");
    if (err != UMS_EAGAIN && err != UMS_ENOMEM)
      tu_fail(__FILE__, __LINE__,
              "err = %d (%s), expected UMS_EAGAIN or "
              "UMS_ENOMEM",
              err, ums_err_name(err));
    /* The scheduler thread that did start has been joined. */
    CHECK_THREADS(before);
    printf("ums_runtime_new failed cleanly with %s\n", ums_err_name(err));
    return 0;
  }

  if (!rt)
    tu_fail(__FILE__, __LINE__, "ums_runtime_new failed: %d (%s)", err,
            ums_err_name(err));
  CHECK_RC(err, 0);
  CHECK_EQ(ums_runtime_schedulers(rt), NSCHED);
  /* The schedulers and the scheduler monitor (monitor.c). */
  CHECK_EQ(tu_thread_count(), before + NSCHED + 1);
  for (int s = 0; s < NSCHED; s++) {
    ums_spawn_opts_t o = {.sched = s};
    ums_task_t t;
    void *res = NULL;
    CHECK_RC(ums_task_spawn(rt, &o, return_arg, (void *)(uintptr_t)(s + 1), &t),
             0);
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
    CHECK_PTR_EQ(res, (void *)(uintptr_t)(s + 1));
  }
  CHECK_RC(ums_runtime_shutdown(rt, ums_deadline(10 * UMS_NSEC_PER_SEC)), 0);
  CHECK_THREADS(before);
  return 0;
}
