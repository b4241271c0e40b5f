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

static void buf_free(ums_buf_t *b) {
  UMS__UNPOISON(b->data, b->cap);
  free(b->data);
  free(b);
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
    /* Poisoned while cached: a stale pointer into it is reported. */
    UMS__POISON(b->data, b->cap);
    b->next = s->bufs.head[b->cls];
    s->bufs.head[b->cls] = b;
    s->bufs.n[b->cls]++;
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
