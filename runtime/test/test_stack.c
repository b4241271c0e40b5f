/*
** test_stack.c: the fiber stack allocator (stack.c).
**
** Runs every check with the guard method the kernel offers (MADV_GUARD_
** INSTALL on 6.13+), then again with the mprotect fallback forced through
** UMS_STACK_GUARD=mprotect, on fewer stacks: that method costs two VMAs
** per stack and vm.max_map_count is usually 65,530.
*/

#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

#define STACK_SIZE (64 * 1024)
#define MANY_MADVISE 100000
#define MANY_MPROTECT 5000
/* Sanitizer runtimes map and split their own memory as the test goes
** (shadow, allocator regions), which moves the line count of
** /proc/self/maps by a few hundred; the checks allow that much. */
#define MAPS_SLACK 1000
/* The most stacks one slab holds (stack.c's SLAB_MAX_SLOTS): after every
** stack is freed, the pool may keep one empty slab. */
#define SLAB_MAX_SLOTS 1024
/* stack.c's resident stacks: the free slots per slab whose top
** RESIDENT_BYTES keep their pages. */
#define RESIDENT_MAX 4
#define RESIDENT_BYTES (64 * 1024)

static size_t page;

static long maps_lines(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  long n = 0;
  int c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

/* Whether addr lies in any mapping: mincore fails with ENOMEM on a hole. */
static bool is_mapped(const void *addr) {
  unsigned char vec;
  void *pg = (void *)((uintptr_t)addr & ~(uintptr_t)(page - 1));
  return mincore(pg, page, &vec) == 0 || errno != ENOMEM;
}

/* Forks a child that writes one byte at addr. Returns the signal that
** killed it, or 0 if it survived the write. */
static int write_in_child(char *addr) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return -1;
  }
  if (pid == 0) {
    /* Sanitizer runtimes catch SIGSEGV to print a report and exit with
    ** a status; the plain default action is what the test looks for. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    *(volatile char *)addr = 1;
    _exit(0);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  return WEXITSTATUS(status) == 0 ? 0 : -1;
}

static void test_sizes(void) {
  ums__stack_pool_t p;
  CHECK(ums__stack_pool_init(&p, 1000) == 0);
  CHECK(p.stack_size == UMS_STACK_SIZE_MIN);
  CHECK(p.slot_size == p.stack_size + page);
  ums__stack_pool_destroy(&p);

  CHECK(ums__stack_pool_init(&p, STACK_SIZE + 1) == 0);
  CHECK(p.stack_size % page == 0 && p.stack_size >= STACK_SIZE + 1 &&
        p.stack_size < STACK_SIZE + 1 + page);
  ums__stack_t st;
  CHECK(ums__stack_alloc(&p, &st) == 0);
  CHECK(st.size == p.stack_size);
  CHECK((uintptr_t)st.lo % page == 0);
  ums__stack_free(&p, &st);
  ums__stack_pool_destroy(&p);

  CHECK(ums__stack_pool_init(&p, SIZE_MAX) == UMS_EINVAL);
  CHECK(ums__stack_pool_init(&p, SIZE_MAX / 2) == UMS_EINVAL);
}

/* Checks that a write just below lo faults, and one at lo does not. */
static void check_guard(const ums__stack_t *st) {
  char *lo = st->lo;
  CHECK(write_in_child(lo - 1) == SIGSEGV);
  CHECK(write_in_child(lo - page) == SIGSEGV);
  CHECK(write_in_child(lo) == 0);
  CHECK(write_in_child(lo + st->size - 1) == 0);
}

/* Allocates n stacks from one pool (fewer if the kernel only offers
** mprotect guards), touches the top and bottom byte of each, checks the
** mappings and the guards, frees them all and checks the slabs went. */
static void test_many(const char *force, int n) {
  if (force)
    setenv("UMS_STACK_GUARD", force, 1);
  else
    unsetenv("UMS_STACK_GUARD");
  long maps_before = maps_lines();
  ums__stack_pool_t p;
  CHECK(ums__stack_pool_init(&p, STACK_SIZE) == 0);
  if (force)
    CHECK(strcmp(ums__stack_guard_kind(&p), force) == 0);
  else
    CHECK(strcmp(ums__stack_guard_kind(&p), "unknown") == 0);

  ums__stack_t *st = calloc((size_t)n, sizeof *st);
  char **los = calloc((size_t)n, sizeof *los);
  if (!st || !los) {
    fprintf(stderr, "calloc failed\n");
    exit(1);
  }
  int got = 0;
  for (; got < n; got++) {
    int rc = ums__stack_alloc(&p, &st[got]);
    if (rc != 0) {
      fprintf(stderr, "stack %d of %d: error %d (guard %s)\n", got, n, rc,
              ums__stack_guard_kind(&p));
      failures++;
      break;
    }
    /* An old kernel: mprotect guards cost two VMAs per stack. */
    if (got == 0 && strcmp(ums__stack_guard_kind(&p), "mprotect") == 0 &&
        n > MANY_MPROTECT)
      n = MANY_MPROTECT;
    char *lo = los[got] = st[got].lo;
    CHECK(st[got].size == STACK_SIZE);
    CHECK(st[got].slab != NULL);
    /* Both ends hold the index, so an overlap between stacks shows. */
    memcpy(lo, &got, sizeof got);
    memcpy(lo + STACK_SIZE - sizeof got, &got, sizeof got);
  }
  const char *kind = ums__stack_guard_kind(&p);
  CHECK(p.in_use == (size_t)got);

  int bad = 0;
  for (int i = 0; i < got; i++) {
    int a, b;
    memcpy(&a, los[i], sizeof a);
    memcpy(&b, los[i] + STACK_SIZE - sizeof b, sizeof b);
    bad += a != i || b != i;
  }
  CHECK(bad == 0);

  long maps_full = maps_lines();
  printf("  %s guards: %d stacks, %zu slabs, %ld lines in /proc/self/maps\n",
         kind, got, p.nslabs, maps_full);
  if (strcmp(kind, "madvise") == 0) {
    /* Guard markers do not split mappings: a VMA per slab at most. */
    CHECK(maps_full - maps_before <= (long)p.nslabs + MAPS_SLACK);
    CHECK(maps_full < 65530 / 16);
  } else {
    CHECK(strcmp(kind, "mprotect") == 0);
    /* Two VMAs per stack: its guard and itself. */
    CHECK(maps_full - maps_before >= 2L * got - MAPS_SLACK);
  }

  /* The first stack sits at the start of the first slab; the middle one
  ** and the last one in the largest slabs. */
  if (got > 0) {
    check_guard(&st[0]);
    check_guard(&st[got / 2]);
    check_guard(&st[got - 1]);
  }

  /* Free in an order that empties slabs one after the other. */
  for (int i = 0; i < got; i++) ums__stack_free(&p, &st[i]);
  CHECK(p.in_use == 0);
  /* Every slab emptied; one is kept against mmap churn. */
  CHECK(p.nslabs <= 1);
  int mapped = 0;
  for (int i = 0; i < got; i++) mapped += is_mapped(los[i]);
  CHECK(mapped <= SLAB_MAX_SLOTS);
  /* The kept slab is one VMA, or with mprotect guards two per slot that
  ** was ever handed out. */
  CHECK(maps_lines() <=
        maps_before + MAPS_SLACK +
            (strcmp(kind, "madvise") == 0 ? 1 : 2 * SLAB_MAX_SLOTS + 1));

  /* Reuse after free: the kept slab serves first, its stacks were given
  ** back to the kernel and read as zeros (but for its few resident ones,
  ** whose top, here the whole stack, kept its pages), and the guards
  ** still hold. */
  int again = got < 2 * SLAB_MAX_SLOTS ? got : 2 * SLAB_MAX_SLOTS;
  int nonzero = 0;
  for (int i = 0; i < again; i++) {
    CHECK(ums__stack_alloc(&p, &st[i]) == 0);
    char *lo = st[i].lo;
    nonzero += lo[0] != 0 || lo[STACK_SIZE - 1] != 0;
    lo[0] = lo[STACK_SIZE - 1] = 1;
  }
  CHECK(nonzero <= RESIDENT_MAX);
  if (again > 0) check_guard(&st[0]);
  for (int i = again - 1; i >= 0; i--) ums__stack_free(&p, &st[i]);
  CHECK(p.in_use == 0);
  CHECK(p.nslabs <= 1);

  ums__stack_pool_destroy(&p);
  CHECK(p.nslabs == 0);
  mapped = 0;
  for (int i = 0; i < got; i++) mapped += is_mapped(los[i]);
  CHECK(mapped == 0);
  CHECK(maps_lines() <= maps_before + MAPS_SLACK);
  free(los);
  free(st);
  unsetenv("UMS_STACK_GUARD");
}

/* The free list and the slab list: a freed stack is handed out again
** before any new memory, and an emptied slab is kept only once. */
static void test_reuse(void) {
  unsetenv("UMS_STACK_GUARD");
  ums__stack_pool_t p;
  CHECK(ums__stack_pool_init(&p, STACK_SIZE) == 0);
  ums__stack_t a, b, c;
  CHECK(ums__stack_alloc(&p, &a) == 0);
  CHECK(ums__stack_alloc(&p, &b) == 0);
  CHECK(ums__stack_alloc(&p, &c) == 0);
  CHECK(p.nslabs == 1);
  char *b_lo = b.lo;
  memset(b_lo, 0xab, STACK_SIZE);
  ums__stack_free(&p, &b);
  CHECK(b.lo == NULL);
  CHECK(ums__stack_alloc(&p, &b) == 0);
  CHECK((char *)b.lo == b_lo);
  /* A resident slot: its whole stack, no larger than RESIDENT_BYTES, kept
  ** its pages (test_resident gives back the rest). */
  CHECK(b_lo[0] == (char)0xab && b_lo[STACK_SIZE - 1] == (char)0xab);
  CHECK(p.nslabs == 1);
  ums__stack_free(&p, &a);
  ums__stack_free(&p, &b);
  ums__stack_free(&p, &c);
  CHECK(p.nslabs == 1); /* the empty slab is kept */

  /* Fill two slabs and more; emptying them keeps one. */
  enum { N = 100 };
  ums__stack_t st[N];
  for (int i = 0; i < N; i++) CHECK(ums__stack_alloc(&p, &st[i]) == 0);
  CHECK(p.nslabs >= 3);
  for (int i = 0; i < N; i += 2) ums__stack_free(&p, &st[i]);
  size_t nslabs = p.nslabs;
  /* Half the slots are free: no new slab for as many stacks. */
  for (int i = 0; i < N; i += 2) CHECK(ums__stack_alloc(&p, &st[i]) == 0);
  CHECK(p.nslabs == nslabs);
  for (int i = 0; i < N; i++) ums__stack_free(&p, &st[i]);
  CHECK(p.nslabs == 1);
  CHECK(p.in_use == 0);
  ums__stack_pool_destroy(&p);
  CHECK(p.nslabs == 0);
}

/* Freed stacks give their pages back but for the top RESIDENT_BYTES of
** at most RESIDENT_MAX free slots per slab (stack.c, "Resident stacks"),
** which are handed out first: a short runtime's worker finds the pages
** it touched last time, without a TLB shootdown in between. */
static void test_resident(void) {
  unsetenv("UMS_STACK_GUARD");
  enum { N = RESIDENT_MAX + 2 };
  size_t size = 4 * RESIDENT_BYTES;
  ums__stack_pool_t p;
  ums__stack_t st[N];
  char *lo[N];
  CHECK(ums__stack_pool_init(&p, size) == 0);
  for (int i = 0; i < N; i++) {
    CHECK(ums__stack_alloc(&p, &st[i]) == 0);
    lo[i] = st[i].lo;
    lo[i][0] = lo[i][size - RESIDENT_BYTES - 1] = 1;  /* given back */
    lo[i][size - RESIDENT_BYTES] = lo[i][size - 1] = 2;  /* kept */
  }
  CHECK(p.nslabs == 1);
  /* The first RESIDENT_MAX freed are resident; the others are not. */
  for (int i = 0; i < N; i++) ums__stack_free(&p, &st[i]);
  /* Last freed, first handed out. */
  for (int i = N - 1; i >= 0; i--) {
    ums__stack_t s;
    CHECK(ums__stack_alloc(&p, &s) == 0);
    CHECK((char *)s.lo == lo[i]);
    char kept = i < RESIDENT_MAX ? 2 : 0;
    CHECK(lo[i][0] == 0 && lo[i][size - RESIDENT_BYTES - 1] == 0);
    CHECK(lo[i][size - RESIDENT_BYTES] == kept && lo[i][size - 1] == kept);
    st[i] = s;
  }
  for (int i = 0; i < N; i++) ums__stack_free(&p, &st[i]);
  CHECK(p.in_use == 0);
  ums__stack_pool_destroy(&p);
}

/* A destroyed pool leaves its empty slab, guards and all, to the next
** pool of the same stack size (stack.c, "Kept slabs"). A stack size no
** other case uses, so that no slab kept before serves. */
static void test_kept_slab(void) {
  unsetenv("UMS_STACK_GUARD");
  ums__stack_pool_t p, q;
  ums__stack_t st;
  CHECK(ums__stack_pool_init(&p, 3 * STACK_SIZE) == 0);
  CHECK(ums__stack_alloc(&p, &st) == 0);
  char *lo = st.lo;
  lo[0] = 1;
  ums__stack_free(&p, &st);
  ums__stack_pool_destroy(&p);
  CHECK(p.nslabs == 0);
  CHECK(is_mapped(lo));
  CHECK(ums__stack_pool_init(&q, 3 * STACK_SIZE) == 0);
  CHECK(ums__stack_alloc(&q, &st) == 0);
  CHECK(st.lo == lo);
  CHECK(lo[0] == 0);  /* the stack's pages were given back */
  CHECK(strcmp(ums__stack_guard_kind(&q), ums__stack_guard_kind(&p)) == 0);
  check_guard(&st);
  ums__stack_free(&q, &st);
  ums__stack_pool_destroy(&q);
}

int main(void) {
  page = (size_t)sysconf(_SC_PAGESIZE);
  test_kept_slab();
  test_sizes();
  test_reuse();
  test_resident();
  test_many(NULL, MANY_MADVISE);
  test_many("mprotect", MANY_MPROTECT);

  if (failures) {
    fprintf(stderr, "test_stack: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_stack: ok\n");
  return 0;
}
