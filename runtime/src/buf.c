/*
** buf.c: reference-counted, page-aligned I/O buffers and the
** per-scheduler cache that keeps a read loop from allocating.
**
** A buffer's data is page-aligned because the kernel copies into a buffer
** that starts a few bytes into a page several times slower (and glibc's
** malloc(1 MiB) returns exactly such a buffer). Sizes are rounded
** up to a power-of-two class from 4 KiB to 4 MiB; a buffer whose last
** reference is dropped on a scheduler thread goes to that scheduler's
** cache (a LIFO per class, bounded in bytes), elsewhere it is freed.
** Buffers belong to no runtime, so one taken on scheduler A may end in B's
** cache; memory is memory.
**
** Buffers of the smallest class are carved, BLOCK_BUFS at a time, from
** one page-aligned block when a scheduler's cache has none: a server
** whose connections each get a short message at once takes hundreds in
** one completion pass, and glibc's page-aligned allocation of each
** (a chunk split per buffer) made a process's first burst of
** connections several times slower than the next. The block owns the
** data and the headers of its buffers; it is freed when the last of
** them is (block->live, atomic: buffers end on any thread).
*/
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define PAGE 4096
/* Bytes a class may keep cached per scheduler, and a cap on the count.
** The count covers a socket server's receives (ums_net_recv_take), which
** take a buffer each when their data comes (one of the smallest class
** for a short message) and give it back once their task has taken the
** data: one pass may hand out one per ready connection, as many as a
** ring's completion queue holds (io-uring.c, CQ_ENTRIES). */
#define CACHE_BYTES_PER_CLASS (8u << 20)
#define CACHE_MAX_PER_CLASS 1024u
#define BLOCK_BUFS 16u

struct ums__buf_block {
  _Atomic uint32_t live; /* [atomic] its buffers not yet freed */
  void *mem;             /* [const] BLOCK_BUFS smallest-class buffers */
  ums_buf_t bufs[BLOCK_BUFS];
};

static int size_class(size_t size) {
  if (size <= (size_t)1 << UMS__BUF_MIN_SHIFT) return 0;
  /* The smallest class whose size (4 KiB << class) holds size. */
  int cls = 64 - __builtin_clzll((unsigned long long)size - 1) -
            UMS__BUF_MIN_SHIFT;
  return cls < UMS__BUF_CLASSES ? cls : -1;
}

static uint32_t cache_limit(int cls) {
  size_t bytes = (size_t)1 << (UMS__BUF_MIN_SHIFT + cls);
  size_t n = CACHE_BYTES_PER_CLASS / bytes;
  if (n < 2) n = 2;
  return n > CACHE_MAX_PER_CLASS ? CACHE_MAX_PER_CLASS : (uint32_t)n;
}

/* Puts b in s's cache (room checked by the caller), poisoned while it is
** there: a stale pointer into it is reported. */
static void cache_push(ums__sched_t *s, ums_buf_t *b) {
  UMS__POISON(b->data, b->cap);
  b->next = s->bufs.head[b->cls];
  s->bufs.head[b->cls] = b;
  s->bufs.n[b->cls]++;
}

static void buf_free(ums_buf_t *b) {
  UMS__UNPOISON(b->data, b->cap);
  ums__buf_block_t *k = b->block;
  if (!k) {
    free(b->data);
    free(b);
  } else if (atomic_fetch_sub_explicit(&k->live, 1, memory_order_acq_rel) ==
             1) {
    free(k->mem);
    free(k);
  }
}

/* A smallest-class buffer carved from a new block; the block's others go
** to s's cache (room for them is checked by the caller). NULL when out
** of memory. */
static ums_buf_t *carve(ums__sched_t *s) {
  ums__buf_block_t *k = malloc(sizeof *k);
  if (!k) return NULL;
  size_t cap = (size_t)1 << UMS__BUF_MIN_SHIFT;
  if (posix_memalign(&k->mem, PAGE, cap * BLOCK_BUFS) != 0) {
    free(k);
    return NULL;
  }
  atomic_init(&k->live, BLOCK_BUFS);
  for (uint32_t i = 0; i < BLOCK_BUFS; i++) {
    ums_buf_t *b = &k->bufs[i];
    b->cls = 0;
    b->cap = cap;
    b->data = (char *)k->mem + i * cap;
    b->block = k;
    if (i > 0) cache_push(s, b);
  }
  return &k->bufs[0];
}

ums_buf_t *ums_buf_new(size_t size) {
  if (size == 0 || size > ((size_t)1 << 40)) return NULL;
  int cls = size_class(size);
  ums__sched_t *s = ums__sched_current();
  ums_buf_t *b;
  if (s && cls >= 0 && (b = s->bufs.head[cls]) != NULL) {
    s->bufs.head[cls] = b->next;
    s->bufs.n[cls]--;
    UMS__UNPOISON(b->data, b->cap);
  } else if (s && cls == 0 &&
             s->bufs.n[0] + BLOCK_BUFS <= cache_limit(0) &&
             (b = carve(s)) != NULL) {
    /* carved: its siblings are cached */
  } else {
    size_t cap = cls >= 0 ? (size_t)1 << (UMS__BUF_MIN_SHIFT + cls)
                          : (size + PAGE - 1) & ~(size_t)(PAGE - 1);
    b = malloc(sizeof *b);
    if (!b) return NULL;
    if (posix_memalign(&b->data, PAGE, cap) != 0) {
      free(b);
      return NULL;
    }
    b->cls = cls;
    b->cap = cap;
    b->block = NULL;
  }
  b->size = size;
  b->next = NULL;
  atomic_store_explicit(&b->refs, 1, memory_order_relaxed);
  return b;
}

void ums_buf_retain(ums_buf_t *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

void ums_buf_release(ums_buf_t *b) {
  if (!b) return;
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
    return;
  ums__sched_t *s = ums__sched_current();
  if (s && b->cls >= 0 && s->bufs.n[b->cls] < cache_limit(b->cls)) {
    cache_push(s, b);
    return;
  }
  buf_free(b);
}

void *ums_buf_data(const ums_buf_t *b) { return b ? b->data : NULL; }

size_t ums_buf_size(const ums_buf_t *b) { return b ? b->size : 0; }

void ums__buf_cache_clear(ums__buf_cache_t *c) {
  for (int i = 0; i < UMS__BUF_CLASSES; i++) {
    while (c->head[i]) {
      ums_buf_t *b = c->head[i];
      c->head[i] = b->next;
      buf_free(b);
    }
    c->n[i] = 0;
  }
}
