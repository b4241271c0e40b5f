/*
** timer.c: each scheduler's timer heap, a binary min-heap of timer nodes
** embedded in their owners, ordered by deadline and, for equal deadlines,
** by arm order, so tasks sleeping until the same instant wake in the order
** they went to sleep. All functions are [owner] only.
*/
#include "internal.h"

#include <stdlib.h>

void ums__timer_heap_init(ums__timer_heap_t *h) {
  h->nodes = NULL;
  h->n = h->cap = 0;
  h->seq = 0;
  h->looked = 0;
}

static inline bool before(const ums__timer_t *a, const ums__timer_t *b) {
  return a->deadline < b->deadline ||
         (a->deadline == b->deadline && a->seq < b->seq);
}

void ums__timer_heap_destroy(ums__timer_heap_t *h) {
  free(h->nodes);
  ums__timer_heap_init(h);
}

int ums__timer_heap_reserve(ums__timer_heap_t *h, uint32_t n) {
  if (n <= h->cap) return 0;
  uint32_t cap = h->cap ? h->cap : 64;
  while (cap < n) cap *= 2;
  ums__timer_t **nodes = realloc(h->nodes, (size_t)cap * sizeof *nodes);
  if (!nodes) return UMS_ENOMEM;
  h->nodes = nodes;
  h->cap = cap;
  return 0;
}

static inline void place(ums__timer_heap_t *h, uint32_t i, ums__timer_t *t) {
  h->nodes[i] = t;
  t->index = i + 1;
}

static void sift_up(ums__timer_heap_t *h, uint32_t i) {
  ums__timer_t *t = h->nodes[i];
  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (!before(t, h->nodes[parent])) break;
    place(h, i, h->nodes[parent]);
    i = parent;
  }
  place(h, i, t);
}

static void sift_down(ums__timer_heap_t *h, uint32_t i) {
  ums__timer_t *t = h->nodes[i];
  for (;;) {
    uint32_t child = 2 * i + 1;
    if (child >= h->n) break;
    if (child + 1 < h->n && before(h->nodes[child + 1], h->nodes[child]))
      child++;
    if (!before(h->nodes[child], t)) break;
    place(h, i, h->nodes[child]);
    i = child;
  }
  place(h, i, t);
}

void ums__timer_arm(ums__timer_heap_t *h, ums__timer_t *t, int64_t deadline) {
  if (ums__timer_armed(t)) ums__timer_disarm(h, t);
  /* Room was reserved when the owner was created; growing here would make
  ** a wait allocate, so running out is a bug, not a runtime condition. */
  if (h->n == h->cap && ums__timer_heap_reserve(h, h->n + 1) != 0) abort();
  t->deadline = deadline;
  t->seq = h->seq++;
  h->nodes[h->n] = t;
  t->index = ++h->n;
  sift_up(h, h->n - 1);
}

void ums__timer_disarm(ums__timer_heap_t *h, ums__timer_t *t) {
  if (!ums__timer_armed(t)) return;
  uint32_t i = t->index - 1;
  t->index = 0;
  ums__timer_t *last = h->nodes[--h->n];
  if (i == h->n) return;
  place(h, i, last);
  if (i > 0 && before(last, h->nodes[(i - 1) / 2]))
    sift_up(h, i);
  else
    sift_down(h, i);
}

int ums__timer_expire(ums__sched_t *s, ums__timer_heap_t *h, int64_t now) {
  int fired = 0;
  /* Tasks the callbacks wake go to the urgent queue (sched.c): a timer
  ** that comes due while others run wakes its task on time. One armed
  ** since the last look and due already was due when it was armed (a
  ** sleep or a timeout shorter than the switch): its task goes to the back
  ** of the run queue, as a yield does, or a loop of such sleeps would run
  ** ahead of every other task for a whole urgent streak. The heap may also
  ** be used on its own, with no scheduler (s == NULL). */
  uint64_t fresh = h->looked;
  h->looked = h->seq;
  while (h->n && h->nodes[0]->deadline <= now) {
    ums__timer_t *t = h->nodes[0];
    ums__timer_disarm(h, t);
    if (s) s->expiring = t->seq < fresh;
    t->cb(s, t);
    fired++;
  }
  if (s) s->expiring = false;
  return fired;
}
