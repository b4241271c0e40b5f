/*
** pages.c: zeroed memory for the runtime's large tables, and the regions
** kept for the process between runtimes.
**
** The runtime itself (most of it the task table's chunk index) and each
** chunk of the task table are large and mostly untouched by a short
** runtime; the schedulers' array is made and freed once per runtime, and
** would fragment the heap (sched.c). They come from mmap, which the
** kernel zeroes page by page as they are touched. Unmapping them at
** shutdown makes the kernel flush other CPUs' TLBs in a process with
** several threads, and a program may start many short runtimes (a test
** framework starts one per test): so a region its owner has cleared again
** (only what it used) is kept, at most KEEP_MAX for the process, for the
** next request of the same size. A child made by fork inherits the
** mappings with their contents: kept regions stay valid there.
*/
#include "internal.h"

#include <pthread.h>
#include <sys/mman.h>

#define KEEP_MAX 4

static struct {
  pthread_mutex_t lock;
  void *region[KEEP_MAX];  /* [lock] all zero, owned by nobody */
  size_t size[KEEP_MAX];   /* [lock] */
  int n;                   /* [lock] */
} kept = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

/* The forking thread may have left the lock taken. */
static void kept_after_fork(void) { pthread_mutex_init(&kept.lock, NULL); }
static void kept_setup(void) { pthread_atfork(NULL, NULL, kept_after_fork); }

void *ums__pages_alloc(size_t n) {
  void *p = NULL;
  pthread_mutex_lock(&kept.lock);
  for (int i = 0; i < kept.n; i++) {
    if (kept.size[i] == n) {
      p = kept.region[i];
      kept.n--;
      kept.region[i] = kept.region[kept.n];
      kept.size[i] = kept.size[kept.n];
      break;
    }
  }
  pthread_mutex_unlock(&kept.lock);
  if (p) return p;
  p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
           0);
  return p == MAP_FAILED ? NULL : p;
}

void ums__pages_free(void *p, size_t n, bool zeroed) {
  if (!p) return;
  if (zeroed) {
    pthread_once(&kept_once, kept_setup);
    pthread_mutex_lock(&kept.lock);
    bool keep = kept.n < KEEP_MAX;
    if (keep) {
      kept.region[kept.n] = p;
      kept.size[kept.n] = n;
      kept.n++;
    }
    pthread_mutex_unlock(&kept.lock);
    if (keep) return;
  }
  munmap(p, n);
}
