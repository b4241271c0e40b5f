/*
** stack.c: the per-scheduler allocator of fiber stacks.
**
** Stacks are carved from slabs: large anonymous mappings cut into equal
** slots, each a guard page followed by the stack proper (stacks grow down,
** so an overflow runs into the guard of its own slot):
**
**   slab:  | guard | stack 0 | guard | stack 1 | ... | guard | stack n-1 |
**
** Guard pages are installed with MADV_GUARD_INSTALL, which marks page
** table entries and leaves the mapping whole: a slab stays one VMA
** however many of its stacks are guarded, and neighbouring slabs may even
** merge. Kernels before 6.13 refuse it with EINVAL; the pool then falls
** back to mprotect(PROT_NONE), which splits the mapping into two VMAs per
** guarded stack and so stops near 32,000 stacks (vm.max_map_count).
**
** Slabs grow geometrically (the new slab has as many slots as the pool
** has already, from 16 up to 1024), so a pool with a few stacks costs
** little and a pool with 100,000 costs about a hundred mappings. A slot is
** guarded the first time it is handed out, which spreads the system calls
** over the allocations that need them.
**
** The slab list keeps, in order: at most one empty slab, the slabs with
** free slots, the full slabs. Allocation takes from the front, preferring
** a partly used slab to the empty one so that empty slabs can go away.
** Allocation and free are O(1), apart from the rare new slab. The pool
** belongs to one scheduler thread: no locks.
**
** Kept slabs. A program may start many short runtimes (a test framework
** starts one per test), and mapping a slab, guarding its first slot and
** unmapping it again (a TLB shootdown in a process with several threads)
** was a good part of a short runtime's start and stop. So a pool being
** destroyed leaves its empty slabs (at most KEEP_MAX of at most
** KEEP_BYTES each, for the process) to the next pool with the same slot
** size, guards and all; their stacks' pages were given back when the
** stacks were freed (but for its resident stacks' tops, below), so a
** kept slab costs address space and at most RESIDENT_MAX *
** RESIDENT_BYTES of memory. A child made by fork inherits the mappings
** and may use them too.
**
** Resident stacks. Giving a freed stack's pages back (MADV_DONTNEED) is a
** TLB shootdown in a process with several threads, and the next user of
** the slot faults the same pages in again, which a short runtime (one
** worker, a few pages of its stack touched) would pay at every stop and
** start. So each slab leaves the top RESIDENT_BYTES (the
** end a stack starts from) of at most RESIDENT_MAX of its free slots in
** place, and gives back only the rest; a shallow stack then costs a
** system call that finds nothing to unmap. Free slots are reused last
** freed first, so those are the slots handed out next. This keeps at most
** RESIDENT_MAX * RESIDENT_BYTES of memory per slab.
*/

#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if !defined(UMS_ASAN) &&                                                      \
    (defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer))
#define UMS_ASAN 1
#endif
#if UMS_ASAN
#include <sanitizer/asan_interface.h>
#endif

/* Defined by Linux 6.13+; the value is ABI, older headers lack it. */
#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif
#ifndef MAP_STACK
#define MAP_STACK 0
#endif

#define GUARD_UNKNOWN 0
#define GUARD_MADVISE 1
#define GUARD_MPROTECT 2

/* Far beyond any sane fiber stack; keeps slot arithmetic from
** overflowing. */
#define STACK_MAX ((size_t)1 << 40)
#define SLAB_MIN_SLOTS 16u
#define SLAB_MAX_SLOTS 1024u
#define SLAB_MAX_BYTES ((size_t)1 << 30)
/* Resident stacks (above): how many free slots per slab, how much of
** each, and the mark of such a slot in top[] (slot indices are far
** below it). */
#define RESIDENT_MAX 4u
#define RESIDENT_BYTES ((size_t)64 * 1024)
#define RESIDENT_BIT ((uint32_t)1 << 31)

struct ums__slab {
  ums_link_t link;               /* on the pool's list, see above */
  char *base;                    /* the mapping */
  size_t map_size;
  size_t slot_size;
  int guard_mode;                /* how its guards were put */
  uint32_t nslots;
  uint32_t nfree;  /* slots not handed out */
  uint32_t nfresh; /* slots [nfresh, nslots) were never
                      handed out and have no guard yet */
  uint32_t ntop;   /* entries in top[] */
  uint32_t nresident; /* entries of top[] marked RESIDENT_BIT */
  /* Indices of the free slots below nfresh, used as a stack, each with
  ** RESIDENT_BIT when the top of its stack kept its pages. They live
  ** here rather than in the free stacks themselves, whose pages were
  ** given back to the kernel and would fault on a write. */
  uint32_t top[];
};

static size_t page_size(void) {
  static size_t cached;
  if (!cached) {
    long n = sysconf(_SC_PAGESIZE);
    cached = n > 0 ? (size_t)n : 4096;
  }
  return cached;
}

static bool slab_empty(const struct ums__slab *sl) {
  return sl->nfree == sl->nslots;
}

#define SLAB(l) UMS_LIST_ENTRY(l, struct ums__slab, link)

static void list_unlink(ums__stack_pool_t *p, struct ums__slab *sl) {
  ums_list_remove(&p->slabs, &sl->link);
}

/* Where a slab with free slots goes: behind the kept empty slab, if any,
** so that the empty one stays first. */
static void list_push_partial(ums__stack_pool_t *p, struct ums__slab *sl) {
  struct ums__slab *head = SLAB(p->slabs.head);
  if (head && slab_empty(head))
    ums_list_insert_after(&p->slabs, &head->link, &sl->link);
  else
    ums_list_push_front(&p->slabs, &sl->link);
}

static void slab_unmap(ums__stack_pool_t *p, struct ums__slab *sl) {
  list_unlink(p, sl);
  munmap(sl->base, sl->map_size);
  free(sl);
  p->nslabs--;
}

#define KEEP_MAX 4
#define KEEP_BYTES ((size_t)64 << 20)

static struct {
  pthread_mutex_t lock;
  struct ums__slab *slabs[KEEP_MAX]; /* [lock] empty, off every pool */
  int n;                             /* [lock] */
} kept = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

/* The forking thread may have left the lock taken. */
static void kept_after_fork(void) { pthread_mutex_init(&kept.lock, NULL); }
static void kept_setup(void) { pthread_atfork(NULL, NULL, kept_after_fork); }

/* Leaves the empty slab sl to a later pool; false if none may be kept. */
static bool slab_keep(ums__stack_pool_t *p, struct ums__slab *sl) {
  if (sl->map_size > KEEP_BYTES) return false;
  pthread_once(&kept_once, kept_setup);
  pthread_mutex_lock(&kept.lock);
  bool ok = kept.n < KEEP_MAX;
  if (ok) {
    list_unlink(p, sl);
    sl->guard_mode = p->guard_mode;
    kept.slabs[kept.n++] = sl;
    p->nslabs--;
  }
  pthread_mutex_unlock(&kept.lock);
  return ok;
}

/* A kept slab for p's slot size whose guards are of p's kind (p takes
** the kind if it has none yet), or NULL. */
static struct ums__slab *slab_take(ums__stack_pool_t *p) {
  struct ums__slab *sl = NULL;
  pthread_mutex_lock(&kept.lock);
  for (int i = 0; i < kept.n; i++) {
    struct ums__slab *k = kept.slabs[i];
    if (k->slot_size == p->slot_size &&
        (p->guard_mode == GUARD_UNKNOWN || k->guard_mode == GUARD_UNKNOWN ||
         k->guard_mode == p->guard_mode)) {
      sl = k;
      kept.slabs[i] = kept.slabs[--kept.n];
      break;
    }
  }
  pthread_mutex_unlock(&kept.lock);
  if (sl) {
    if (p->guard_mode == GUARD_UNKNOWN) p->guard_mode = sl->guard_mode;
    p->nslabs++;
  }
  return sl;
}

static int slab_new(ums__stack_pool_t *p, struct ums__slab **out) {
  /* Called once per new slab, and slabs are few: counting is cheaper
  ** than keeping a total in the pool. */
  size_t have = 0;
  for (struct ums__slab *it = SLAB(p->slabs.head); it;
       it = SLAB(it->link.next))
    have += it->nslots;
  if (have == 0 && (*out = slab_take(p)) != NULL) return 0;
  size_t want = have < SLAB_MIN_SLOTS   ? SLAB_MIN_SLOTS
                : have > SLAB_MAX_SLOTS ? SLAB_MAX_SLOTS
                                        : have;
  /* Huge stacks make fewer slots per slab, not gigantic mappings. */
  size_t by_bytes = SLAB_MAX_BYTES / p->slot_size;
  if (want > by_bytes) want = by_bytes ? by_bytes : 1;

  /* MAP_NORESERVE keeps untouched stacks free of charge, but a strict
  ** overcommit policy ignores it and charges the whole mapping; a smaller
  ** slab may then still fit. */
  void *base = MAP_FAILED;
  for (; want >= 1; want /= 2) {
    base = mmap(NULL, want * p->slot_size, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base != MAP_FAILED || errno != ENOMEM) break;
  }
  if (base == MAP_FAILED) return UMS_ENOMEM;

  struct ums__slab *sl = malloc(sizeof *sl + want * sizeof sl->top[0]);
  if (!sl) {
    munmap(base, want * p->slot_size);
    return UMS_ENOMEM;
  }
  sl->link.prev = sl->link.next = NULL;
  sl->base = base;
  sl->map_size = want * p->slot_size;
  sl->slot_size = p->slot_size;
  sl->guard_mode = GUARD_UNKNOWN;
  sl->nslots = (uint32_t)want;
  sl->nfree = (uint32_t)want;
  sl->nfresh = 0;
  sl->ntop = 0;
  sl->nresident = 0;
  p->nslabs++;
  *out = sl;
  return 0;
}

/* Puts the guard page of a slot never handed out before. */
static int guard_install(ums__stack_pool_t *p, char *guard) {
  size_t g = p->slot_size - p->stack_size;
  if (p->guard_mode != GUARD_MPROTECT) {
    if (madvise(guard, g, MADV_GUARD_INSTALL) == 0) {
      p->guard_mode = GUARD_MADVISE;
      return 0;
    }
    if (errno != EINVAL || p->guard_mode == GUARD_MADVISE) return UMS_ENOMEM;
    /* The kernel does not know the advice: mprotect from now on. */
    p->guard_mode = GUARD_MPROTECT;
  }
  /* Fails with ENOMEM when the split would pass vm.max_map_count. */
  if (mprotect(guard, g, PROT_NONE) != 0) return UMS_ENOMEM;
  return 0;
}

int ums__stack_pool_init(ums__stack_pool_t *p, size_t stack_size) {
  size_t pg = page_size();
  if (stack_size > STACK_MAX) return UMS_EINVAL;
  if (stack_size < UMS_STACK_SIZE_MIN) stack_size = UMS_STACK_SIZE_MIN;
  stack_size = (stack_size + pg - 1) & ~(pg - 1);

  memset(p, 0, sizeof *p);
  p->stack_size = stack_size;
  p->slot_size = stack_size + pg;
  p->guard_mode = GUARD_UNKNOWN;
  /* UMS_STACK_GUARD=mprotect forces the pre-6.13 guard method, so that
  ** tests (and a user who suspects the new kernel feature) can run the
  ** fallback on any kernel. Other values are ignored. */
  const char *force = getenv("UMS_STACK_GUARD");
  if (force && strcmp(force, "mprotect") == 0) p->guard_mode = GUARD_MPROTECT;
  return 0;
}

void ums__stack_pool_destroy(ums__stack_pool_t *p) {
  struct ums__slab *sl;
  while ((sl = SLAB(p->slabs.head)) != NULL) {
    if (!slab_empty(sl) || !slab_keep(p, sl)) slab_unmap(p, sl);
  }
  p->in_use = 0;
}

int ums__stack_alloc(ums__stack_pool_t *p, ums__stack_t *out) {
  struct ums__slab *sl = SLAB(p->slabs.head);
  /* Spare the kept empty slab when a partly used one can serve. */
  if (sl && slab_empty(sl) && sl->link.next && SLAB(sl->link.next)->nfree)
    sl = SLAB(sl->link.next);
  if (!sl || !sl->nfree) {
    int rc = slab_new(p, &sl);
    if (rc) return rc;
    list_push_partial(p, sl);
  }

  uint32_t i;
  if (sl->ntop) {
    i = sl->top[--sl->ntop];
    if (i & RESIDENT_BIT) {
      sl->nresident--;
      i &= ~RESIDENT_BIT;
    }
  } else {
    i = sl->nfresh;
    int rc = guard_install(p, sl->base + (size_t)i * p->slot_size);
    if (rc) {
      /* A new slab that cannot even guard its first slot is useless. */
      if (slab_empty(sl)) slab_unmap(p, sl);
      return rc;
    }
    sl->nfresh++;
  }
  sl->nfree--;
  if (!sl->nfree) {
    list_unlink(p, sl);
    ums_list_push_back(&p->slabs, &sl->link);
  }
  p->in_use++;

  size_t guard = p->slot_size - p->stack_size;
  out->lo = sl->base + (size_t)i * p->slot_size + guard;
  out->size = p->stack_size;
  out->slab = sl;
  out->index = i;
  return 0;
}

void ums__stack_free(ums__stack_pool_t *p, ums__stack_t *st) {
  struct ums__slab *sl = st->slab;

#if UMS_ASAN
  /* Frames that never returned left redzones in the shadow; the next
  ** user of these addresses (this pool or, once unmapped, any mmap) must
  ** not inherit them. */
  ASAN_UNPOISON_MEMORY_REGION(st->lo, st->size);
#endif
  uint32_t index = st->index;
  bool was_full = sl->nfree == 0;
  size_t keep = 0;
  if (sl->nresident < RESIDENT_MAX) {
    keep = p->stack_size < RESIDENT_BYTES ? p->stack_size : RESIDENT_BYTES;
    sl->nresident++;
  }
  sl->top[sl->ntop++] = index | (keep ? RESIDENT_BIT : 0);
  sl->nfree++;
  p->in_use--;
  st->lo = NULL;
  st->slab = NULL;

  if (slab_empty(sl)) {
    struct ums__slab *head = SLAB(p->slabs.head);
    if (head != sl && slab_empty(head)) {
      /* One empty slab is kept against mmap churn; this is a second. */
      slab_unmap(p, sl);
      return;
    }
    list_unlink(p, sl);
    ums_list_push_front(&p->slabs, &sl->link);
  } else if (was_full) {
    list_unlink(p, sl);
    list_push_partial(p, sl);
  }
  /* The stack's pages go back to the kernel, but for the top `keep`
  ** bytes of a resident slot; the guard page stays. A failure leaves the
  ** memory in place, which is harmless. */
  if (keep < p->stack_size)
    madvise(sl->base + (size_t)index * p->slot_size +
                (p->slot_size - p->stack_size),
            p->stack_size - keep, MADV_DONTNEED);
}

const char *ums__stack_guard_kind(const ums__stack_pool_t *p) {
  switch (p->guard_mode) {
  case GUARD_MADVISE:
    return "madvise";
  case GUARD_MPROTECT:
    return "mprotect";
  default:
    return "unknown";
  }
}
