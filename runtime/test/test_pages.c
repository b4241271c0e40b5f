/*
** test_pages.c: the zeroed regions of the runtime's large tables
** (pages.c): zero when handed out, kept for the next request of the same
** size when given back cleared, given back to the kernel otherwise; and a
** runtime's start and stop leave the next one its tables.
*/
#include "internal.h"
#include "test-util.h"

#include <errno.h>
#include <sys/mman.h>

static size_t page;

/* Whether addr lies in any mapping: mincore fails with ENOMEM on a hole. */
static bool is_mapped(const void *addr) {
  unsigned char vec;
  void *pg = (void *)((uintptr_t)addr & ~(uintptr_t)(page - 1));
  return mincore(pg, page, &vec) == 0 || errno != ENOMEM;
}

static bool all_zero(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return false;
  return true;
}

static void test_kept(void) {
  /* A size nothing else asks for. */
  size_t n = 77 * page;
  char *p = ums__pages_alloc(n);
  CHECK(p != NULL);
  CHECK(((uintptr_t)p & (page - 1)) == 0);
  CHECK(all_zero(p, n));
  p[0] = p[n - 1] = 1;
  p[0] = p[n - 1] = 0;
  ums__pages_free(p, n, true);
  /* Kept, not unmapped; the next request of that size gets it back. */
  CHECK(is_mapped(p));
  char *q = ums__pages_alloc(n);
  CHECK(q == p);
  CHECK(all_zero(q, n));
  /* Given back dirty: unmapped. */
  q[5] = 1;
  ums__pages_free(q, n, false);
  CHECK(!is_mapped(q));
}

/* Runtimes one after another: the second gets the first one's tables,
** cleared, and runs tasks on them as on fresh ones. */
static void *add_one(void *arg) { return (void *)((uintptr_t)arg + 1); }

static int count_task(const ums_task_info_t *info, void *arg) {
  (void)info;
  (void)arg;
  return 0;
}

static void test_runtimes(void) {
  for (int i = 0; i < 20; i++) {
    ums_runtime_t *rt = tu_runtime_new(1);
    for (uintptr_t k = 0; k < 100; k++) {
      ums_task_t t;
      CHECK_RC(ums_task_spawn(rt, NULL, add_one, (void *)k, &t), 0);
      void *res = NULL;
      CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
      CHECK_EQ((uintptr_t)res, k + 1);
    }
    /* Every task has been joined: none shows, from this runtime or an
    ** earlier one whose table this one got. */
    CHECK_EQ(ums_runtime_tasks(rt, count_task, NULL), 0);
    tu_runtime_shutdown(rt);
  }
}

int main(void) {
  page = (size_t)sysconf(_SC_PAGESIZE);
  RUN(test_kept);
  RUN(test_runtimes);
  return 0;
}
