/*
** test_chan.c: channels (chan.c), unbuffered and buffered: blocking,
** FIFO order across the buffer and the parked senders, close, the try_
** calls, zero-size and large elements, deadlines, and host threads on
** either end. The whole suite runs on 1, 2 and 4 schedulers, each time in
** a fresh runtime that is shut down cleanly at the end.
**
** Tests that depend on who is parked when run their parties on the
** driver's own scheduler (cooperative: a task that has been spawned and
** yielded to is parked by the time the driver runs again). Cancellation
** and timeout of channel waits are covered with every other wait in
** test_sync.c.
*/
#include "internal.h"
#include "sync-util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ums_runtime_t *rt;
static int nsched;

/* Scheduler i modulo the runtime's count. */
#define S(i) ((i) % nsched)

static ums_task_t spawn_here(ums_task_fn fn, void *arg) {
  return su_spawn(rt, ums_current_sched(), fn, arg);
}

static void drive(const char *name, ums_task_fn fn) {
  int64_t t0 = ums_now();
  su_join(rt, su_spawn(rt, 0, fn, NULL));
  printf("  %-46s ok (%.1f ms)\n", name, (double)(ums_now() - t0) / 1e6);
}

/* A party that does one operation and records the outcome. */
typedef struct op {
  ums_chan_t *ch;
  int64_t value; /* sent, or received */
  int64_t deadline;
  int rc;
  _Atomic int started, done;
} op_t;

static void op_init(op_t *o, ums_chan_t *ch, int64_t value) {
  memset(o, 0, sizeof *o);
  o->ch = ch;
  o->value = value;
  o->deadline = UMS_FOREVER;
  o->rc = 1;
}

static void *sender(void *arg) {
  op_t *o = arg;
  atomic_store(&o->started, 1);
  o->rc = ums_chan_send(o->ch, &o->value, o->deadline);
  atomic_store(&o->done, 1);
  return NULL;
}

static void *receiver(void *arg) {
  op_t *o = arg;
  atomic_store(&o->started, 1);
  o->rc = ums_chan_recv(o->ch, &o->value, o->deadline);
  atomic_store(&o->done, 1);
  return NULL;
}

/* Spawns a party on the driver's scheduler and lets it park. */
static ums_task_t park(ums_task_fn fn, op_t *o) {
  ums_task_t t = spawn_here(fn, o);
  su_settle();
  CHECK_EQ(atomic_load(&o->started), 1);
  CHECK_EQ(atomic_load(&o->done), 0);
  return t;
}

/* ====================================================================== */

static void props(void) {
  ums_chan_t *ch = ums_chan_new(8, 0);
  CHECK(ch != NULL);
  CHECK_EQ(ums_chan_cap(ch), 0);
  CHECK_EQ(ums_chan_len(ch), 0);
  CHECK_OK(ums_chan_delete(ch));
  ch = ums_chan_new(8, 4);
  CHECK_EQ(ums_chan_cap(ch), 4);
  CHECK_EQ(ums_chan_len(ch), 0);
  CHECK_OK(ums_chan_delete(ch));
  ch = ums_chan_new(0, 0);
  CHECK(ch != NULL);
  CHECK_OK(ums_chan_delete(ch));
  /* capacity * elem_size overflows: refused. */
  CHECK(ums_chan_new(SIZE_MAX / 2, 4) == NULL);
}

/* ---------------------------------------------------------------------- */
/* Unbuffered                                                              */
/* ---------------------------------------------------------------------- */

#define STREAM_N 5000

static void *stream_sender(void *arg) {
  ums_chan_t *ch = arg;
  for (int64_t i = 0; i < STREAM_N; i++)
    CHECK_OK(ums_chan_send(ch, &i, UMS_FOREVER));
  return NULL;
}

static void *unbuffered(void *unused) {
  ums_chan_t *ch = ums_chan_new(sizeof(int64_t), 0);
  op_t o;
  int64_t v = 0;

  /* A send blocks until a receiver takes the value. */
  op_init(&o, ch, 11);
  ums_task_t t = park(sender, &o);
  CHECK_EQ(ums_chan_len(ch), 0); /* nothing is buffered */
  CHECK_EQ(ums_chan_delete(ch), UMS_EBUSY);
  CHECK_OK(ums_chan_recv(ch, &v, UMS_FOREVER));
  CHECK_EQ(v, 11);
  su_join(rt, t);
  CHECK_OK(o.rc);

  /* A receive blocks until a sender comes; try_send hands it over. */
  op_init(&o, ch, 0);
  t = park(receiver, &o);
  CHECK_EQ(ums_chan_delete(ch), UMS_EBUSY);
  v = 12;
  CHECK_OK(ums_chan_try_send(ch, &v));
  su_join(rt, t);
  CHECK_OK(o.rc);
  CHECK_EQ(o.value, 12);

  /* With nobody on the other side the try_ calls refuse. */
  CHECK_EQ(ums_chan_try_send(ch, &v), UMS_EAGAIN);
  CHECK_EQ(ums_chan_try_recv(ch, &v), UMS_EAGAIN);

  /* A parked sender: try_recv takes its value. */
  op_init(&o, ch, 13);
  t = park(sender, &o);
  CHECK_OK(ums_chan_try_recv(ch, &v));
  CHECK_EQ(v, 13);
  su_join(rt, t);
  CHECK_OK(o.rc);

  /* A stream arrives whole and in order, from this scheduler and from
  ** another one. */
  for (int round = 0; round < 2; round++) {
    t = su_spawn(rt, round ? S(1) : 0, stream_sender, ch);
    for (int64_t i = 0; i < STREAM_N; i++) {
      CHECK_OK(ums_chan_recv(ch, &v, UMS_FOREVER));
      CHECK_EQ(v, i);
    }
    su_join(rt, t);
  }
  CHECK_EQ(ums_chan_try_recv(ch, &v), UMS_EAGAIN);
  CHECK_OK(ums_chan_delete(ch));
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* Buffered                                                                */
/* ---------------------------------------------------------------------- */

static void *buffered(void *unused) {
  ums_chan_t *ch = ums_chan_new(sizeof(int64_t), 4);
  op_t o[3];
  ums_task_t t[3];
  int64_t v;

  CHECK_EQ(ums_chan_try_recv(ch, &v), UMS_EAGAIN);
  /* Four sends complete without waiting: a deadline already past does
  ** not matter to a send that need not wait. */
  for (v = 1; v <= 4; v++) {
    CHECK_OK(ums_chan_send(ch, &v, ums_now() - 1));
    CHECK_EQ(ums_chan_len(ch), (size_t)v);
  }
  CHECK_EQ(ums_chan_cap(ch), 4);
  /* The fifth has to wait. */
  v = 99;
  int64_t d = ums_deadline(10 * MS);
  CHECK_EQ(ums_chan_send(ch, &v, d), UMS_ETIMEDOUT);
  CHECK(ums_now() >= d);
  CHECK_EQ(ums_chan_try_send(ch, &v), UMS_EAGAIN);
  CHECK_EQ(ums_chan_len(ch), 4);

  /* Three senders park behind the full buffer, in a known order. */
  for (int i = 0; i < 3; i++) {
    op_init(&o[i], ch, 5 + i);
    t[i] = park(sender, &o[i]);
  }
  CHECK_EQ(ums_chan_len(ch), 4);
  CHECK_EQ(ums_chan_delete(ch), UMS_EBUSY);
  /* Receiving drains the buffer, and each receive wakes the first parked
  ** sender, which puts its value in when it runs: 1..7 in order. */
  for (int64_t want = 1; want <= 7; want++) {
    CHECK_OK(ums_chan_recv(ch, &v, UMS_FOREVER));
    CHECK_EQ(v, want);
    su_settle();
    CHECK_EQ(ums_chan_len(ch), (size_t)(want <= 3 ? 4 : 7 - want));
  }
  for (int i = 0; i < 3; i++) {
    su_join(rt, t[i]);
    CHECK_OK(o[i].rc);
  }
  CHECK_EQ(ums_chan_try_recv(ch, &v), UMS_EAGAIN);

  /* A parked receiver is woken by the next send and takes its value. */
  op_init(&o[0], ch, 0);
  t[0] = park(receiver, &o[0]);
  v = 21;
  CHECK_OK(ums_chan_send(ch, &v, UMS_FOREVER));
  su_join(rt, t[0]);
  CHECK_EQ(ums_chan_len(ch), 0);
  CHECK_EQ(o[0].value, 21);

  /* The ring wraps around many times with order intact. */
  int64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 1000; round++) {
    int k = 1 + round % 4;
    for (int i = 0; i < k; i++, next_in++)
      CHECK_OK(ums_chan_try_send(ch, &next_in));
    for (int i = 0; i < k; i++, next_out++) {
      CHECK_OK(ums_chan_try_recv(ch, &v));
      CHECK_EQ(v, next_out);
    }
  }
  CHECK_OK(ums_chan_delete(ch));
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* Close                                                                   */
/* ---------------------------------------------------------------------- */

static void *close_receivers(void *unused) {
  ums_chan_t *ch = ums_chan_new(sizeof(int64_t), 0);
  op_t o[4];
  ums_task_t t[4];
  int64_t v = 5;
  for (int i = 0; i < 3; i++) {
    op_init(&o[i], ch, -1);
    t[i] = park(receiver, &o[i]);
  }
  op_init(&o[3], ch, -1);
  t[3] = su_spawn(rt, S(1), receiver, &o[3]);
  su_await(&o[3].started, 1);
  if (nsched > 1) su_await_idle(rt, S(1));
  CHECK_OK(ums_chan_close(ch));
  for (int i = 0; i < 4; i++) {
    su_join(rt, t[i]);
    CHECK_EQ(o[i].rc, UMS_ECLOSED);
    CHECK_EQ(o[i].value, -1); /* nothing written */
  }
  CHECK_EQ(ums_chan_close(ch), UMS_ECLOSED);
  CHECK_EQ(ums_chan_send(ch, &v, UMS_FOREVER), UMS_ECLOSED);
  CHECK_EQ(ums_chan_try_send(ch, &v), UMS_ECLOSED);
  CHECK_EQ(ums_chan_recv(ch, &v, UMS_FOREVER), UMS_ECLOSED);
  CHECK_EQ(ums_chan_try_recv(ch, &v), UMS_ECLOSED);
  CHECK_EQ(v, 5);
  CHECK_OK(ums_chan_delete(ch));
  return NULL;
}

static void *close_senders(void *unused) {
  for (size_t cap = 0; cap <= 4; cap += 4) {
    ums_chan_t *ch = ums_chan_new(sizeof(int64_t), cap);
    op_t o[2];
    ums_task_t t[2];
    int64_t v;
    for (v = 1; v <= (int64_t)cap; v++) CHECK_OK(ums_chan_try_send(ch, &v));
    for (int i = 0; i < 2; i++) {
      op_init(&o[i], ch, 100 + i);
      t[i] = park(sender, &o[i]);
    }
    CHECK_OK(ums_chan_close(ch));
    for (int i = 0; i < 2; i++) {
      su_join(rt, t[i]);
      CHECK_EQ(o[i].rc, UMS_ECLOSED); /* parked senders fail */
    }
    /* The buffer still drains after the close, then UMS_ECLOSED; the
    ** refused senders' values never appear. */
    CHECK_EQ(ums_chan_len(ch), cap);
    for (int64_t want = 1; want <= (int64_t)cap; want++) {
      CHECK_OK(ums_chan_recv(ch, &v, UMS_FOREVER));
      CHECK_EQ(v, want);
    }
    CHECK_EQ(ums_chan_recv(ch, &v, UMS_FOREVER), UMS_ECLOSED);
    CHECK_EQ(ums_chan_try_recv(ch, &v), UMS_ECLOSED);
    CHECK_EQ(ums_chan_send(ch, &v, UMS_FOREVER), UMS_ECLOSED);
    CHECK_EQ(ums_chan_close(ch), UMS_ECLOSED);
    CHECK_EQ(ums_chan_len(ch), 0);
    CHECK_OK(ums_chan_delete(ch));
  }
  /* Close with values buffered and nobody waiting; drain from another
  ** scheduler. */
  ums_chan_t *ch = ums_chan_new(sizeof(int64_t), 4);
  int64_t v = 42;
  CHECK_OK(ums_chan_send(ch, &v, UMS_FOREVER));
  CHECK_OK(ums_chan_close(ch));
  CHECK_EQ(ums_chan_try_send(ch, &v), UMS_ECLOSED);
  op_t o;
  op_init(&o, ch, 0);
  su_join(rt, su_spawn(rt, S(1), receiver, &o));
  CHECK_OK(o.rc);
  CHECK_EQ(o.value, 42);
  op_init(&o, ch, 0);
  su_join(rt, su_spawn(rt, S(1), receiver, &o));
  CHECK_EQ(o.rc, UMS_ECLOSED);
  CHECK_OK(ums_chan_delete(ch));
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* Element sizes                                                           */
/* ---------------------------------------------------------------------- */

static void *zero_sender(void *arg) {
  CHECK_OK(ums_chan_send(arg, NULL, UMS_FOREVER));
  return NULL;
}

static void *zero_size(void *unused) {
  /* Unbuffered: a pure rendezvous. */
  ums_chan_t *ch = ums_chan_new(0, 0);
  CHECK(ch != NULL);
  ums_task_t t = spawn_here(zero_sender, ch);
  su_settle();
  CHECK_EQ(ums_chan_delete(ch), UMS_EBUSY); /* the sender is parked */
  CHECK_OK(ums_chan_recv(ch, NULL, UMS_FOREVER));
  su_join(rt, t);
  t = su_spawn(rt, S(1), zero_sender, ch);
  char junk = 'x'; /* a pointer is allowed and left alone */
  CHECK_OK(ums_chan_recv(ch, &junk, UMS_FOREVER));
  CHECK_EQ(junk, 'x');
  su_join(rt, t);
  CHECK_EQ(ums_chan_try_recv(ch, NULL), UMS_EAGAIN);
  CHECK_OK(ums_chan_delete(ch));

  /* Buffered: a counter of tokens. */
  ch = ums_chan_new(0, 3);
  CHECK_EQ(ums_chan_cap(ch), 3);
  for (int i = 0; i < 3; i++) CHECK_OK(ums_chan_try_send(ch, NULL));
  CHECK_EQ(ums_chan_len(ch), 3);
  CHECK_EQ(ums_chan_try_send(ch, NULL), UMS_EAGAIN);
  CHECK_EQ(ums_chan_send(ch, NULL, ums_deadline(MS)), UMS_ETIMEDOUT);
  t = spawn_here(zero_sender, ch);
  su_settle();
  CHECK_EQ(ums_chan_len(ch), 3);
  for (int i = 0; i < 4; i++) CHECK_OK(ums_chan_recv(ch, NULL, UMS_FOREVER));
  su_join(rt, t);
  CHECK_EQ(ums_chan_len(ch), 0);
  CHECK_EQ(ums_chan_try_recv(ch, NULL), UMS_EAGAIN);
  CHECK_OK(ums_chan_try_send(ch, NULL));
  CHECK_OK(ums_chan_close(ch));
  CHECK_OK(ums_chan_recv(ch, NULL, UMS_FOREVER));
  CHECK_EQ(ums_chan_recv(ch, NULL, UMS_FOREVER), UMS_ECLOSED);
  CHECK_OK(ums_chan_delete(ch));
  return NULL;
}

/* 256-byte elements, every byte checked. */
typedef struct big {
  uint32_t seq;
  unsigned char bytes[252];
} big_t;

#define BIG_N 2000

static void big_fill(big_t *b, uint32_t seq) {
  b->seq = seq;
  for (int i = 0; i < (int)sizeof b->bytes; i++)
    b->bytes[i] = (unsigned char)(seq * 31u + (unsigned)i * 7u);
}

static void big_check(const big_t *b, uint32_t seq) {
  big_t want;
  big_fill(&want, seq);
  CHECK_EQ(b->seq, seq);
  CHECK(memcmp(b, &want, sizeof want) == 0);
}

static void *big_sender(void *arg) {
  ums_chan_t *ch = arg;
  big_t b;
  for (uint32_t i = 0; i < BIG_N; i++) {
    big_fill(&b, i);
    CHECK_OK(ums_chan_send(ch, &b, UMS_FOREVER));
    memset(&b, 0xee, sizeof b); /* the channel copied it */
  }
  return NULL;
}

static void *large_elements(void *unused) {
  CHECK_EQ(sizeof(big_t), 256);
  for (size_t cap = 0; cap <= 4; cap += 4) {
    ums_chan_t *ch = ums_chan_new(sizeof(big_t), cap);
    ums_task_t t = su_spawn(rt, S(1), big_sender, ch);
    big_t b;
    for (uint32_t i = 0; i < BIG_N; i++) {
      memset(&b, 0, sizeof b);
      CHECK_OK(ums_chan_recv(ch, &b, UMS_FOREVER));
      big_check(&b, i);
    }
    su_join(rt, t);
    /* A buffered big element after close. */
    big_fill(&b, 77);
    if (cap) CHECK_OK(ums_chan_try_send(ch, &b));
    CHECK_OK(ums_chan_close(ch));
    if (cap) {
      memset(&b, 0, sizeof b);
      CHECK_OK(ums_chan_recv(ch, &b, UMS_FOREVER));
      big_check(&b, 77);
    }
    CHECK_OK(ums_chan_delete(ch));
  }
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* Deadlines                                                               */
/* ---------------------------------------------------------------------- */

static void *delayed_sender(void *arg) {
  ums_chan_t *ch = arg;
  int64_t v = 31;
  CHECK_OK(ums_sleep(5 * MS));
  CHECK_OK(ums_chan_send(ch, &v, ums_deadline(10 * UMS_NSEC_PER_SEC)));
  return NULL;
}

static void *delayed_receiver(void *arg) {
  ums_chan_t *ch = arg;
  int64_t v = 0;
  CHECK_OK(ums_sleep(5 * MS));
  CHECK_OK(ums_chan_recv(ch, &v, ums_deadline(10 * UMS_NSEC_PER_SEC)));
  CHECK_EQ(v, 32);
  return NULL;
}

static void *deadlines(void *unused) {
  for (size_t cap = 0; cap <= 1; cap++) {
    ums_chan_t *ch = ums_chan_new(sizeof(int64_t), cap);
    int64_t v = 0, d;
    d = ums_deadline(10 * MS);
    CHECK_EQ(ums_chan_recv(ch, &v, d), UMS_ETIMEDOUT);
    CHECK(ums_now() >= d);
    CHECK_EQ(ums_chan_recv(ch, &v, ums_now() - 1), UMS_ETIMEDOUT);
    CHECK_EQ(v, 0);
    if (cap) CHECK_OK(ums_chan_try_send(ch, &v)); /* fill it */
    d = ums_deadline(10 * MS);
    CHECK_EQ(ums_chan_send(ch, &v, d), UMS_ETIMEDOUT);
    CHECK(ums_now() >= d);
    if (cap) CHECK_OK(ums_chan_try_recv(ch, &v));
    /* Met before the deadline: granted, not timed out. */
    ums_task_t t = su_spawn(rt, S(1), delayed_sender, ch);
    CHECK_OK(ums_chan_recv(ch, &v, ums_deadline(10 * UMS_NSEC_PER_SEC)));
    CHECK_EQ(v, 31);
    su_join(rt, t);
    if (!cap) {
      t = su_spawn(rt, S(1), delayed_receiver, ch);
      v = 32;
      CHECK_OK(ums_chan_send(ch, &v, ums_deadline(10 * UMS_NSEC_PER_SEC)));
      su_join(rt, t);
    }
    CHECK_OK(ums_chan_delete(ch));
  }
  return NULL;
}

/* ---------------------------------------------------------------------- */
/* Host threads and tasks, many to many                                    */
/* ---------------------------------------------------------------------- */

#define MANY_N 20000
static _Atomic int many_seen[MANY_N];
static _Atomic long many_count;

/* Receives until the channel is closed. Values from one producer arrive
** in increasing order at every consumer. */
static void *many_consumer(void *arg) {
  ums_chan_t *ch = arg;
  int64_t v, last = -1;
  int r;
  while ((r = ums_chan_recv(ch, &v, UMS_FOREVER)) == 0) {
    CHECK(v >= 0 && v < MANY_N);
    CHECK(v > last);
    last = v;
    CHECK_EQ(atomic_fetch_add(&many_seen[v], 1), 0);
    atomic_fetch_add(&many_count, 1);
  }
  CHECK_EQ(r, UMS_ECLOSED);
  return NULL;
}

static void many_reset(void) {
  for (int i = 0; i < MANY_N; i++) atomic_store(&many_seen[i], 0);
  atomic_store(&many_count, 0);
}

static void many_check(void) {
  CHECK_EQ(atomic_load(&many_count), MANY_N);
  for (int i = 0; i < MANY_N; i++) CHECK_EQ(atomic_load(&many_seen[i]), 1);
}

/* The host thread produces; tasks on every scheduler consume. */
static void host_producer(void) {
  for (size_t cap = 0; cap <= 4; cap += 4) {
    int64_t t0 = ums_now();
    ums_chan_t *ch = ums_chan_new(sizeof(int64_t), cap);
    int nc = 2 * nsched;
    ums_task_t t[8];
    many_reset();
    for (int i = 0; i < nc; i++) t[i] = su_spawn(rt, S(i), many_consumer, ch);
    for (int64_t v = 0; v < MANY_N; v++)
      CHECK_OK(ums_chan_send(ch, &v, UMS_FOREVER));
    CHECK_OK(ums_chan_close(ch));
    for (int i = 0; i < nc; i++) su_join(rt, t[i]);
    many_check();
    CHECK_OK(ums_chan_delete(ch));
    printf("  %-46s ok (%.1f ms)\n",
           cap ? "host producer -> tasks, cap 4"
               : "host producer -> tasks, unbuffered",
           (double)(ums_now() - t0) / 1e6);
  }
}

/* Tasks produce (one range each); a host thread and tasks consume. */
typedef struct range {
  ums_chan_t *ch;
  int64_t lo, hi;
} range_t;

static void *range_producer(void *arg) {
  range_t *r = arg;
  for (int64_t v = r->lo; v < r->hi; v++)
    CHECK_OK(ums_chan_send(r->ch, &v, UMS_FOREVER));
  return NULL;
}

static _Atomic long mixed_count;
static _Atomic int mixed_seen[MANY_N];

static void *mixed_consumer(void *arg) {
  ums_chan_t *ch = arg;
  int64_t v;
  int r;
  while ((r = ums_chan_recv(ch, &v, UMS_FOREVER)) == 0) {
    CHECK(v >= 0 && v < MANY_N);
    CHECK_EQ(atomic_fetch_add(&mixed_seen[v], 1), 0);
    atomic_fetch_add(&mixed_count, 1);
  }
  CHECK_EQ(r, UMS_ECLOSED);
  return NULL;
}

static void task_producers_host_consumer(void) {
  for (size_t cap = 0; cap <= 4; cap += 4) {
    int64_t t0 = ums_now();
    ums_chan_t *ch = ums_chan_new(sizeof(int64_t), cap);
    range_t r[4];
    ums_task_t p[4], c[4];
    pthread_t host;
    for (int i = 0; i < MANY_N; i++) atomic_store(&mixed_seen[i], 0);
    atomic_store(&mixed_count, 0);
    CHECK_OK(pthread_create(&host, NULL, mixed_consumer, ch));
    for (int i = 0; i < 4; i++)
      c[i] = su_spawn(rt, S(i + 1), mixed_consumer, ch);
    for (int i = 0; i < 4; i++) {
      r[i].ch = ch;
      r[i].lo = (int64_t)i * MANY_N / 4;
      r[i].hi = (int64_t)(i + 1) * MANY_N / 4;
      p[i] = su_spawn(rt, S(i), range_producer, &r[i]);
    }
    for (int i = 0; i < 4; i++) su_join(rt, p[i]);
    CHECK_OK(ums_chan_close(ch));
    CHECK_OK(pthread_join(host, NULL));
    for (int i = 0; i < 4; i++) su_join(rt, c[i]);
    CHECK_EQ(atomic_load(&mixed_count), MANY_N);
    for (int i = 0; i < MANY_N; i++) CHECK_EQ(atomic_load(&mixed_seen[i]), 1);
    CHECK_OK(ums_chan_delete(ch));
    printf("  %-46s ok (%.1f ms)\n",
           cap ? "task producers -> host + tasks, cap 4"
               : "task producers -> host + tasks, unbuffered",
           (double)(ums_now() - t0) / 1e6);
  }
}

/* ---------------------------------------------------------------------- */
/* The last user frees the channel                                         */
/* ---------------------------------------------------------------------- */
/*
** A party woken by a send, a receive or a close knows it is now the
** channel's only user and deletes it at once, while the waker may still
** be returning from its call; the waker must not touch the channel after
** the wake that lets the last user go (see the same test for the other
** primitives in test_sync.c). The waker is a task on another scheduler;
** the party alternates between a task and this host thread. ASan or TSan
** report a touch after the free; other builds corrupt the heap or spin
** on the freed lock word, which the watchdog turns into a failure.
** LC_SEND_POLL: a buffered channel whose receiver timed out once (it
** left the "receiver waits" flag behind) and then polls: the sender that
** saw the flag still owes a wake-up when the receiver takes the value.
*/

enum {
  LC_SEND,
  LC_RECV,
  LC_CLOSE_RECEIVER,
  LC_CLOSE_SENDER,
  LC_SEND_POLL,
  LC_N
};
static const char *const lc_name[LC_N] = {
    "send wakes receiver", "recv wakes sender", "close wakes receiver",
    "close wakes sender", "send to a polling receiver"};

#define LC_ITERS 20000
static ums_chan_t *lc_obj; /* ums_chan_t *: the channel, party -> waker */
static int lc_kind;

/* Polling costs a CPU the other party may need: fewer rounds. */
static int lc_iters(void) {
  return lc_kind == LC_SEND_POLL ? LC_ITERS / 4 : LC_ITERS;
}

/* Serves channels until it is sent NULL, after the last round. */
static void *lc_waker(void *arg) {
  for (;;) {
    ums_chan_t *c = NULL;
    int64_t v = 5;
    CHECK_OK(ums_chan_recv(lc_obj, &c, UMS_FOREVER));
    if (!c) break;
    switch (lc_kind) {
    case LC_SEND:
    case LC_SEND_POLL:
      CHECK_OK(ums_chan_send(c, &v, UMS_FOREVER));
      break;
    case LC_RECV:
      CHECK_OK(ums_chan_recv(c, &v, UMS_FOREVER));
      CHECK_EQ(v, 6);
      break;
    default:
      CHECK_OK(ums_chan_close(c));
      break;
    }
  }
  return NULL;
}

static void lc_one(void) {
  ums_chan_t *c = ums_chan_new(sizeof(int64_t), lc_kind == LC_SEND_POLL);
  int64_t v = 6;
  if (lc_kind == LC_SEND_POLL)
    CHECK_EQ(ums_chan_recv(c, &v, ums_now() - 1), UMS_ETIMEDOUT);
  CHECK_OK(ums_chan_send(lc_obj, &c, UMS_FOREVER));
  switch (lc_kind) {
  case LC_SEND_POLL: {
    int r;
    while ((r = ums_chan_try_recv(c, &v)) == UMS_EAGAIN) sched_yield();
    CHECK_OK(r);
    CHECK_EQ(v, 5);
    break;
  }
  case LC_SEND:
    CHECK_OK(ums_chan_recv(c, &v, UMS_FOREVER));
    CHECK_EQ(v, 5);
    break;
  case LC_RECV:
    CHECK_OK(ums_chan_send(c, &v, UMS_FOREVER));
    break;
  case LC_CLOSE_RECEIVER:
    CHECK_EQ(ums_chan_recv(c, &v, UMS_FOREVER), UMS_ECLOSED);
    break;
  case LC_CLOSE_SENDER:
    CHECK_EQ(ums_chan_send(c, &v, UMS_FOREVER), UMS_ECLOSED);
    break;
  }
  CHECK_OK(ums_chan_delete(c));
}

static void *lc_party_task(void *arg) {
  lc_one();
  return NULL;
}

static void last_user_frees(void) {
  lc_obj = ums_chan_new(sizeof(ums_chan_t *), 1);
  for (lc_kind = 0; lc_kind < LC_N; lc_kind++) {
    int64_t t0 = ums_now();
    /* Fewer rounds on a loaded machine (su_more_rounds). */
    int64_t until = t0 + 5 * UMS_NSEC_PER_SEC;
    su_watchdog_start(lc_name[lc_kind], 30);
    ums_task_t w = su_spawn(rt, S(1), lc_waker, NULL);
    int i = 0;
    for (; su_more_rounds(i, lc_iters(), until); i++) {
      if (i % 2)
        lc_one(); /* this host thread */
      else
        su_join(rt, su_spawn(rt, 0, lc_party_task, NULL));
      su_watchdog_progress();
    }
    ums_chan_t *none = NULL;
    CHECK_OK(ums_chan_send(lc_obj, &none, UMS_FOREVER));
    su_join(rt, w);
    su_watchdog_stop();
    printf("  last user frees: %-29s ok (%d rounds, %.1f ms)\n",
           lc_name[lc_kind], i, (double)(ums_now() - t0) / 1e6);
  }
  CHECK_OK(ums_chan_delete(lc_obj));
}

/* ====================================================================== */

int main(void) {
  static const int configs[] = {1, 2, 4};
  setvbuf(stdout, NULL, _IOLBF, 0);
  props();
  for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
    nsched = configs[c];
    printf("test_chan: %d scheduler%s\n", nsched, nsched > 1 ? "s" : "");
    rt = su_runtime(nsched, 0);
    drive("unbuffered: blocking, order, try_", unbuffered);
    drive("buffered: cap 4, FIFO over buffer + senders", buffered);
    drive("close: pending receivers", close_receivers);
    drive("close: parked senders, drain, double close", close_senders);
    drive("elem_size 0", zero_size);
    drive("256-byte elements", large_elements);
    drive("deadlines", deadlines);
    host_producer();
    task_producers_host_consumer();
    su_teardown(rt);
  }
  /* Last, so that everything above has reported if this one fails. */
  nsched = 2;
  printf("test_chan: last user frees, %d schedulers\n", nsched);
  rt = su_runtime(nsched, 0);
  last_user_frees();
  su_teardown(rt);
  printf("test_chan: ok\n");
  return 0;
}
