/*
** lalloc.c: a cache of small freed blocks in front of a VM's allocator
** while a run uses the VM.
**
** Why: every ums.spawn makes a task handle (a full userdata) that the
** collector frees later, so a task costs one malloc and one free at
** least. The collector frees in bursts (a sweep step frees every dead
** handle it meets), which overflows glibc's per-thread cache (7 blocks a
** size), and the scheduler threads make the process multi-threaded, so the
** rest goes through the arenas' atomic fast bins, with atomic operations
** on every malloc and free. A VM is used by one thread at a time, so a
** plain free list per block size, with no atomics, serves the same blocks
** again at the cost of a pointer swap.
**
** Only exact sizes are cached: a block freed with size n (Lua always
** tells the size it allocated) is handed out again only for a request of
** size n, so blocks the VM allocated before the cache was installed, or
** through a host's own allocator, are reused exactly as the allocator
** underneath made them. Every block in the cache came from that allocator
** and goes back to it (lums_alloc_remove). The cache holds at most
** CACHE_BYTES, so the memory it keeps from the allocator underneath is
** bounded; an allocation the allocator underneath refuses first gives the
** cache back to it and tries again.
**
** Under AddressSanitizer a cached block is poisoned while it waits, so a
** use of a Lua object after the collector freed it is still reported (as
** use-after-poison) instead of silently reading a recycled block.
**
** Threads: the cache belongs to its VM and is touched only inside that
** VM's allocation calls, i.e. by whichever thread runs the VM (the run's
** hand-overs between the main thread and the scheduler threads order
** them).
*/
#include "lums.h"
#include "lalloc.h"

#include <stdlib.h>


/* Largest block size cached; Lua's small objects (task handles, tables,
** closures, short strings, upvalues) are below it. */
#define CACHE_MAX_SIZE 256
/* Bytes the cache may hold at once. A sweep frees a whole cycle's dead
** objects in a burst that allocations then drain, so the cache must hold
** about what the VM allocates between two sweeps: a spawn+join loop with
** 1,000 tasks in flight frees more than 1 MiB between sweeps, and fits
** in 4 MiB. */
#define CACHE_BYTES (4096 * 1024)

struct lalloc {
  lua_Alloc f;           /* the allocator underneath, and its state */
  void *ud;
  size_t bytes;          /* held in the lists */
  size_t budget;         /* CACHE_BYTES; 0 once it must stop caching */
  void *list[CACHE_MAX_SIZE + 1];  /* by exact size: linked through each
                                      block's first word */
};

static void cache_flush(lalloc *a) {
  for (size_t n = sizeof(void *); n <= CACHE_MAX_SIZE; n++) {
    void *p = a->list[n];
    while (p) {
      LUMS_UNPOISON(p, n);
      void *next = *(void **)p;
      a->f(a->ud, p, n, 0);
      p = next;
    }
    a->list[n] = NULL;
  }
  a->bytes = 0;
}

/* An allocation the allocator underneath refused while the cache holds
** blocks: they go back first, and it is tried again. Out of line and
** cold, so that cache_miss saves no registers for the flush's loop. */
static __attribute__((noinline, cold)) void *cache_retry(lalloc *a, void *ptr,
                                                         size_t osize,
                                                         size_t nsize) {
  cache_flush(a);
  return a->f(a->ud, ptr, osize, nsize);
}

/* What the cache cannot serve: the allocator underneath. Out of line,
** so that the hits below need no stack frame. */
static __attribute__((noinline)) void *cache_miss(lalloc *a, void *ptr,
                                                  size_t osize,
                                                  size_t nsize) {
  void *p = a->f(a->ud, ptr, osize, nsize);
  if (__builtin_expect(!p && nsize && a->bytes, 0))
    return cache_retry(a, ptr, osize, nsize);
  return p;
}

static void *cache_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  lalloc *a = ud;
  if (nsize == 0) {
    /* A free (of a real block: osize is its size). */
    if (ptr && osize >= sizeof(void *) && osize <= CACHE_MAX_SIZE &&
        a->bytes + osize <= a->budget) {
      *(void **)ptr = a->list[osize];
      LUMS_POISON(ptr, osize);
      a->list[osize] = ptr;
      a->bytes += osize;
      return NULL;
    }
  } else if (!ptr && nsize <= CACHE_MAX_SIZE && a->list[nsize]) {
    /* A new block (osize is then a type tag, not a size). */
    void *p = a->list[nsize];
    LUMS_UNPOISON(p, nsize);
    a->list[nsize] = *(void **)p;
    a->bytes -= nsize;
    return p;
  }
  return cache_miss(a, ptr, osize, nsize);
}

lalloc *lums_alloc_install(lua_State *L) {
  lalloc *a = calloc(1, sizeof *a);
  if (!a) return NULL;  /* no cache: the VM works as before */
  a->f = lua_getallocf(L, &a->ud);
  a->budget = CACHE_BYTES;
  lua_setallocf(L, cache_alloc, a);
  return a;
}

void lums_alloc_remove(lua_State *L, lalloc *a) {
  if (!a) return;
  void *ud;
  if (L && lua_getallocf(L, &ud) != cache_alloc) {
    /* Somebody installed an allocator over this one (which theirs may
    ** call): it must stay, but it caches nothing from now on. */
    cache_flush(a);
    a->budget = 0;
    return;
  }
  if (L) lua_setallocf(L, a->f, a->ud);
  cache_flush(a);
  free(a);
}
