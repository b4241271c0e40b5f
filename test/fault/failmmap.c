/*
** failmmap: an LD_PRELOAD library for the fault job that makes anonymous
** mmap calls fail with ENOMEM, the way a process that has reached its
** memory limit sees them.
**
**   UMS_FAIL_MMAP_AFTER=N   the first N anonymous mappings succeed, every
**                           later one fails (counted over the whole
**                           process; unset: none fails)
**   UMS_FAIL_MMAP_VERBOSE=1 prints each anonymous mapping and its fate on
**                           stderr, to choose N
**
** strace's `inject=mmap:...:when=N+` counts per thread, so it cannot fail
** the mappings a new scheduler thread makes after a given point of the
** whole run; this counter can. File mappings (the dynamic loader's) are
** left alone: only memory is short, not the program's code.
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

static atomic_long calls;

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  static _Atomic(mmap_fn) real;
  mmap_fn next = atomic_load(&real);
  if (!next) {
    next = (mmap_fn)dlsym(RTLD_NEXT, "mmap");
    atomic_store(&real, next);
  }
  if (flags & MAP_ANONYMOUS) {
    static long after = -2;
    if (after == -2) {
      const char *s = getenv("UMS_FAIL_MMAP_AFTER");
      after = s ? atol(s) : -1;
    }
    long n = atomic_fetch_add(&calls, 1) + 1;
    int fail = after >= 0 && n > after;
    const char *v = getenv("UMS_FAIL_MMAP_VERBOSE");
    if (v && *v == '1') {
      char line[96];
      int k = snprintf(line, sizeof line, "failmmap: #%ld %zu bytes%s\n", n,
                       len, fail ? ": ENOMEM" : "");
      if (k > 0) (void)!write(2, line, (size_t)k);
    }
    if (fail) {
      errno = ENOMEM;
      return MAP_FAILED;
    }
  }
  return next(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
    __attribute__((alias("mmap")));
