/*
** failalloc.c: an LD_PRELOAD library that makes allocations fail with
** ENOMEM, for tests of what a program does when memory runs out.
**
**   LD_PRELOAD=/path/to/libfailalloc.so program ...
**
** It replaces malloc, calloc, realloc, mmap and mmap64 (free, memalign and
** the like are left alone: they never fail for lack of memory in a way
** callers check). A replaced call either fails (NULL, or MAP_FAILED, with
** errno = ENOMEM) or goes to glibc. Only anonymous mappings count as mmap
** calls here: a file mapping is the program's code or data, not memory it
** may run short of.
**
** Nothing fails until the library is armed, so that start-up (the dynamic
** loader, the interpreter, the program's own set-up) runs normally. The
** program arms and disarms it by looking up an environment variable, which
** any language can do:
**
**   getenv("FAILALLOC_ARM")     arms it; returns "1"
**   getenv("FAILALLOC_DISARM")  disarms it; returns "1"
**   getenv("FAILALLOC_COUNT")   the number of calls failed so far, as a
**                               decimal string (valid until the next call)
**
** (from Lua: os.getenv("FAILALLOC_ARM")). FAILALLOC_ARMED=1 in the
** environment arms it from the start instead.
**
** Which calls fail, while armed (environment variables, read once):
**
**   FAILALLOC_FUNCS   comma-separated subset of malloc,calloc,realloc,mmap
**                     (mmap covers mmap64): the calls that may fail.
**                     Default: all of them.
**   FAILALLOC_AFTER   N: the first N eligible calls after arming succeed
**                     (default 0).
**   FAILALLOC_EVERY   K: past those, every Kth eligible call fails
**                     (default 1: every one).
**   FAILALLOC_SEED    S: instead of EVERY, each eligible call past AFTER
**   FAILALLOC_PERMILLE  fails with probability PERMILLE/1000 (default 10),
**                     drawn from a generator seeded with S: the same seed
**                     fails the same calls of the same sequence.
**   FAILALLOC_MMAP_MIN  bytes: an mmap smaller than this never fails
**                     (default 0). Large mappings are thread stacks, fiber
**                     stacks and arenas; small ones are mostly libraries.
**   FAILALLOC_VERBOSE  1: at exit, writes to stderr how many calls failed.
**
** Eligible calls are counted across all threads (atomically); with more
** than one thread, which thread gets the Nth call depends on timing.
**
** Built without sanitizers: under AddressSanitizer its malloc would sit
** behind ASan's (which is preloaded first), so only mmap failures take
** effect there, and ASan's own mappings may fail.
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* glibc's own entry points: calling them needs no dlsym, which itself
** allocates. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

enum { F_MALLOC = 1, F_CALLOC = 2, F_REALLOC = 4, F_MMAP = 8 };

static _Atomic int armed;
static _Atomic int configured;    /* 0, 1 while reading, 2 read */
static int funcs = F_MALLOC | F_CALLOC | F_REALLOC | F_MMAP;
static uint64_t after, every = 1, seed, permille = 10;
static size_t mmap_min;
static bool random_mode, verbose;
static _Atomic uint64_t eligible;  /* eligible calls since arming */
static _Atomic uint64_t failed;

typedef char *(*getenv_fn)(const char *);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
static _Atomic(getenv_fn) real_getenv_p;
static _Atomic(mmap_fn) real_mmap_p;

/* The environment is read without getenv (which this library replaces):
** environ is set before any constructor runs. */
static const char *env(const char *name) {
  extern char **environ;
  size_t n = strlen(name);
  for (char **e = environ; e && *e; e++)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  return NULL;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = env(name);
  return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void report(void) {
  if (verbose)
    fprintf(stderr, "failalloc: %llu calls failed\n",
            (unsigned long long)atomic_load(&failed));
}

static void configure(void) {
  int expect = 0;
  if (!atomic_compare_exchange_strong(&configured, &expect, 1)) {
    while (atomic_load(&configured) != 2) {
    }
    return;
  }
  const char *f = env("FAILALLOC_FUNCS");
  if (f && *f) {
    funcs = 0;
    if (strstr(f, "malloc")) funcs |= F_MALLOC;
    if (strstr(f, "calloc")) funcs |= F_CALLOC;
    if (strstr(f, "realloc")) funcs |= F_REALLOC;
    if (strstr(f, "mmap")) funcs |= F_MMAP;
  }
  after = env_u64("FAILALLOC_AFTER", 0);
  every = env_u64("FAILALLOC_EVERY", 1);
  if (every == 0) every = 1;
  random_mode = env("FAILALLOC_SEED") != NULL;
  seed = env_u64("FAILALLOC_SEED", 0);
  permille = env_u64("FAILALLOC_PERMILLE", 10);
  mmap_min = (size_t)env_u64("FAILALLOC_MMAP_MIN", 0);
  verbose = env_u64("FAILALLOC_VERBOSE", 0) != 0;
  if (env_u64("FAILALLOC_ARMED", 0)) atomic_store(&armed, 1);
  atomic_store(&configured, 2);
  atomic_thread_fence(memory_order_seq_cst);
}

__attribute__((constructor)) static void init(void) {
  configure();
  atexit(report);
}

/* splitmix64: a counter-based generator, so that no state is shared. */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Whether this call of func should fail. */
static bool should_fail(int func) {
  if (!atomic_load_explicit(&armed, memory_order_relaxed)) return false;
  if (atomic_load(&configured) != 2) configure();
  if (!(funcs & func)) return false;
  uint64_t n = atomic_fetch_add(&eligible, 1);
  if (n < after) return false;
  bool fail = random_mode ? mix(seed ^ mix(n)) % 1000 < permille
                          : (n - after) % every == 0;
  if (fail) atomic_fetch_add(&failed, 1);
  return fail;
}

void *malloc(size_t n) {
  if (should_fail(F_MALLOC)) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_malloc(n);
}

void *calloc(size_t n, size_t m) {
  if (should_fail(F_CALLOC)) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n) {
  /* A shrink to 0 is a free, which cannot fail. */
  if (n && should_fail(F_REALLOC)) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_realloc(p, n);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  mmap_fn real = atomic_load(&real_mmap_p);
  if (!real) {
    real = (mmap_fn)dlsym(RTLD_NEXT, "mmap");
    atomic_store(&real_mmap_p, real);
  }
  if ((flags & MAP_ANONYMOUS) && len >= mmap_min && should_fail(F_MMAP)) {
    errno = ENOMEM;
    return MAP_FAILED;
  }
  return real(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
    __attribute__((alias("mmap")));

char *getenv(const char *name) {
  static _Thread_local char count[24];
  if (strncmp(name, "FAILALLOC_", 10) == 0) {
    if (strcmp(name + 10, "ARM") == 0) {
      if (atomic_load(&configured) != 2) configure();
      atomic_store(&eligible, 0);
      atomic_store(&armed, 1);
      return "1";
    }
    if (strcmp(name + 10, "DISARM") == 0) {
      atomic_store(&armed, 0);
      return "1";
    }
    if (strcmp(name + 10, "COUNT") == 0) {
      snprintf(count, sizeof count, "%llu",
               (unsigned long long)atomic_load(&failed));
      return count;
    }
  }
  getenv_fn real = atomic_load(&real_getenv_p);
  if (!real) {
    real = (getenv_fn)dlsym(RTLD_NEXT, "getenv");
    atomic_store(&real_getenv_p, real);
  }
  return real(name);
}
