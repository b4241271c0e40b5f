/*
** test_timer.c: the scheduler's timer heap (timer.c), driven directly
** through its internal interface, with a plain array as the model it
** must agree with.
*/
#include "internal.h"
#include "test-util.h"

#define NTIMERS 10000

/* A timer embedded in its owner, the way a task embeds its own. */
typedef struct owner {
  ums__timer_t timer;
  int id;
  bool armed;       /* the model: should it be in the heap? */
  int64_t deadline; /* the model: its deadline while armed */
  int fired;        /* callback runs */
} owner_t;

static owner_t owners[NTIMERS];

/* Callback log, in firing order. */
static int fired_ids[NTIMERS * 2];
static int nfired;

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint64_t rng(void) {
  /* xorshift64*: deterministic, so a failure reproduces. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1du;
}

static void record_cb(ums__sched_t *s, ums__timer_t *t) {
  owner_t *o = UMS__CONTAINER_OF(t, owner_t, timer);
  CHECK(s == NULL);
  /* The heap must have let go of the node before running its callback,
  ** so that the callback may re-arm it. */
  CHECK_EQ(t->index, 0);
  o->fired++;
  o->armed = false;
  fired_ids[nfired++] = o->id;
}

static void reset_owners(ums__timer_cb cb) {
  memset(owners, 0, sizeof owners);
  for (int i = 0; i < NTIMERS; i++) {
    owners[i].id = i;
    owners[i].timer.cb = cb;
  }
  nfired = 0;
}

/* The whole heap against the model: sizes, the index of every node (slot
** + 1 in both directions), the heap order, and the earliest deadline. */
static void check_heap(const ums__timer_heap_t *h) {
  uint32_t armed = 0;
  int64_t min = UMS_FOREVER;
  for (int i = 0; i < NTIMERS; i++) {
    const owner_t *o = &owners[i];
    CHECK_EQ(ums__timer_armed(&o->timer), o->armed);
    if (!o->armed) {
      CHECK_EQ(o->timer.index, 0);
      continue;
    }
    armed++;
    CHECK_GE(o->timer.index, 1);
    CHECK_LE(o->timer.index, h->n);
    CHECK_PTR_EQ(h->nodes[o->timer.index - 1], &o->timer);
    CHECK_EQ(o->timer.deadline, o->deadline);
    if (o->deadline < min) min = o->deadline;
  }
  CHECK_EQ(h->n, armed);
  CHECK_LE(h->n, h->cap);
  for (uint32_t i = 0; i < h->n; i++) {
    CHECK_EQ(h->nodes[i]->index, i + 1);
    if (i > 0) CHECK_LE(h->nodes[(i - 1) / 2]->deadline, h->nodes[i]->deadline);
  }
  CHECK_EQ(ums__timer_next(h), min);
}

static void arm(ums__timer_heap_t *h, owner_t *o, int64_t deadline) {
  ums__timer_arm(h, &o->timer, deadline);
  o->armed = true;
  o->deadline = deadline;
}

static void disarm(ums__timer_heap_t *h, owner_t *o) {
  ums__timer_disarm(h, &o->timer);
  o->armed = false;
}

/* Expires at now and checks the outcome against the model: exactly the
** timers due at now fired, once each, in deadline order, and nothing due
** is left behind. */
static void expire_and_check(ums__timer_heap_t *h, int64_t now) {
  bool due[NTIMERS];
  int ndue = 0;
  for (int i = 0; i < NTIMERS; i++) {
    due[i] = owners[i].armed && owners[i].deadline <= now;
    ndue += due[i];
  }
  int before[NTIMERS];
  for (int i = 0; i < NTIMERS; i++) before[i] = owners[i].fired;
  int64_t deadlines[NTIMERS];
  for (int i = 0; i < NTIMERS; i++) deadlines[i] = owners[i].deadline;

  nfired = 0;
  CHECK_EQ(ums__timer_expire(NULL, h, now), ndue);
  CHECK_EQ(nfired, ndue);
  for (int k = 0; k < nfired; k++) {
    int id = fired_ids[k];
    CHECK(due[id]);
    if (k > 0) CHECK_LE(deadlines[fired_ids[k - 1]], deadlines[id]);
  }
  for (int i = 0; i < NTIMERS; i++)
    CHECK_EQ(owners[i].fired - before[i], due[i] ? 1 : 0);
  if (h->n) CHECK_GT(ums__timer_next(h), now);
  check_heap(h);
}

/* ---------------------------------------------------------------------- */

static void test_reserve(void) {
  ums__timer_heap_t h;
  ums__timer_heap_init(&h);
  CHECK_EQ(h.n, 0);
  CHECK_EQ(h.cap, 0);
  CHECK_EQ(ums__timer_next(&h), UMS_FOREVER);
  CHECK_RC(ums__timer_heap_reserve(&h, 0), 0);

  CHECK_RC(ums__timer_heap_reserve(&h, 1), 0);
  CHECK_GE(h.cap, 1);
  CHECK(h.nodes != NULL);
  CHECK_RC(ums__timer_heap_reserve(&h, 1000), 0);
  CHECK_GE(h.cap, 1000);
  uint32_t cap = h.cap;
  /* Reserving less never shrinks. */
  CHECK_RC(ums__timer_heap_reserve(&h, 10), 0);
  CHECK_EQ(h.cap, cap);

  /* Arming up to the reserve never moves the array: a wait must not
  ** allocate. */
  reset_owners(record_cb);
  ums__timer_t **nodes = h.nodes;
  for (uint32_t i = 0; i < cap && i < NTIMERS; i++)
    arm(&h, &owners[i], (int64_t)(rng() % 1000));
  CHECK_PTR_EQ(h.nodes, nodes);
  check_heap(&h);

  /* Growing keeps the armed timers. */
  CHECK_RC(ums__timer_heap_reserve(&h, cap * 4), 0);
  CHECK_GE(h.cap, cap * 4);
  check_heap(&h);
  expire_and_check(&h, UMS_FOREVER);
  CHECK_EQ(h.n, 0);

  ums__timer_heap_destroy(&h);
  CHECK(h.nodes == NULL);
  CHECK_EQ(h.n, 0);
  CHECK_EQ(h.cap, 0);
}

static void test_arm_disarm_single(void) {
  ums__timer_heap_t h;
  ums__timer_heap_init(&h);
  CHECK_RC(ums__timer_heap_reserve(&h, 4), 0);
  reset_owners(record_cb);
  owner_t *a = &owners[0], *b = &owners[1];

  CHECK(!ums__timer_armed(&a->timer));
  arm(&h, a, 100);
  CHECK(ums__timer_armed(&a->timer));
  CHECK_EQ(ums__timer_next(&h), 100);
  /* Re-arming an armed timer moves it; it is in the heap once. */
  arm(&h, a, 50);
  CHECK_EQ(h.n, 1);
  CHECK_EQ(ums__timer_next(&h), 50);
  arm(&h, b, 70);
  arm(&h, a, 90);
  CHECK_EQ(h.n, 2);
  CHECK_EQ(ums__timer_next(&h), 70);
  check_heap(&h);
  /* Disarming twice is harmless. */
  disarm(&h, b);
  disarm(&h, b);
  CHECK_EQ(h.n, 1);
  CHECK_EQ(ums__timer_next(&h), 90);
  check_heap(&h);
  /* Nothing is due before the deadline; the deadline itself is due. */
  expire_and_check(&h, 89);
  CHECK_EQ(nfired, 0);
  expire_and_check(&h, 90);
  CHECK_EQ(nfired, 1);
  CHECK_EQ(a->fired, 1);
  CHECK_EQ(b->fired, 0);
  CHECK_EQ(ums__timer_next(&h), UMS_FOREVER);
  ums__timer_heap_destroy(&h);
}

/* 10,000 timers through random arm, re-arm and disarm, with the heap
** checked against the model after every round and expiries in between. */
static void test_random(void) {
  ums__timer_heap_t h;
  ums__timer_heap_init(&h);
  CHECK_RC(ums__timer_heap_reserve(&h, NTIMERS), 0);
  reset_owners(record_cb);

  int64_t now = 0;
  for (int round = 0; round < 40; round++) {
    for (int k = 0; k < NTIMERS; k++) {
      owner_t *o = &owners[rng() % NTIMERS];
      /* Deadlines from a narrow range, so that many coincide. */
      int64_t d = now + (int64_t)(rng() % 5000);
      switch (rng() % 4) {
      case 0:
      case 1:
        arm(&h, o, d); /* arm or re-arm */
        break;
      case 2:
        disarm(&h, o);
        break;
      case 3:
        if (o->armed)
          disarm(&h, o);
        else
          arm(&h, o, d);
        break;
      }
    }
    check_heap(&h);
    now += (int64_t)(rng() % 2500);
    expire_and_check(&h, now);
  }
  /* Everything left is due at the end of time. */
  int left = (int)h.n;
  expire_and_check(&h, UMS_FOREVER);
  CHECK_EQ(nfired, left);
  CHECK_EQ(h.n, 0);
  for (int i = 0; i < NTIMERS; i++) CHECK(!ums__timer_armed(&owners[i].timer));
  ums__timer_heap_destroy(&h);
}

/* Expiry in order with distinct deadlines: the firing order is exactly the
** sorted order, whatever order they were armed in. */
static void test_expire_order(void) {
  ums__timer_heap_t h;
  ums__timer_heap_init(&h);
  CHECK_RC(ums__timer_heap_reserve(&h, NTIMERS), 0);
  reset_owners(record_cb);
  /* A permutation of 0..NTIMERS-1 as deadlines (times 10). */
  int perm[NTIMERS];
  for (int i = 0; i < NTIMERS; i++) perm[i] = i;
  for (int i = NTIMERS - 1; i > 0; i--) {
    int j = (int)(rng() % (uint64_t)(i + 1));
    int tmp = perm[i];
    perm[i] = perm[j];
    perm[j] = tmp;
  }
  for (int i = 0; i < NTIMERS; i++) arm(&h, &owners[i], perm[i] * 10);
  check_heap(&h);

  /* In slices: every slice fires exactly the deadlines up to now. */
  int next = 0;
  for (int64_t now = 5; now < NTIMERS * 10; now += 777) {
    expire_and_check(&h, now);
    for (int k = 0; k < nfired; k++) {
      CHECK_EQ(owners[fired_ids[k]].deadline, next * 10);
      next++;
    }
  }
  expire_and_check(&h, UMS_FOREVER);
  for (int k = 0; k < nfired; k++) {
    CHECK_EQ(owners[fired_ids[k]].deadline, next * 10);
    next++;
  }
  CHECK_EQ(next, NTIMERS);
  ums__timer_heap_destroy(&h);
}

/* Callbacks may touch the heap: re-arm themselves for later (not fired
** again in this pass) or disarm another timer that was due (not fired). */
static ums__timer_heap_t *cb_heap;

static void rearm_cb(ums__sched_t *s, ums__timer_t *t) {
  owner_t *o = UMS__CONTAINER_OF(t, owner_t, timer);
  record_cb(s, t);
  if (o->id % 2 == 0) {
    /* Even ids come back 1000 later. */
    arm(cb_heap, o, o->deadline + 1000);
  } else if (o->id + 1 < 100 && owners[o->id + 1].armed) {
    /* Odd ids cancel their successor. */
    disarm(cb_heap, &owners[o->id + 1]);
  }
}

static void test_callbacks_touch_heap(void) {
  ums__timer_heap_t h;
  ums__timer_heap_init(&h);
  CHECK_RC(ums__timer_heap_reserve(&h, 100), 0);
  reset_owners(rearm_cb);
  cb_heap = &h;
  for (int i = 0; i < 100; i++) arm(&h, &owners[i], i);
  nfired = 0;
  CHECK_EQ(ums__timer_expire(NULL, &h, 99), nfired);
  /* 0 fires and comes back at 1000; every odd id fires and disarms the
  ** even one after it before that one's turn. */
  CHECK_EQ(fired_ids[0], 0);
  CHECK_EQ(fired_ids[1], 1);
  for (int k = 2; k < nfired; k++) CHECK_EQ(fired_ids[k] % 2, 1);
  CHECK_EQ(nfired, 51); /* 0 and the 50 odd ids */
  CHECK_EQ(owners[0].fired, 1);
  CHECK(owners[0].armed);
  CHECK_EQ(ums__timer_next(&h), 1000);
  check_heap(&h);
  ums__timer_heap_destroy(&h);
}

int main(void) {
  RUN(test_reserve);
  RUN(test_arm_disarm_single);
  RUN(test_random);
  RUN(test_expire_order);
  RUN(test_callbacks_touch_heap);
  return 0;
}
