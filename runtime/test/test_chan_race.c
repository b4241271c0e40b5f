/*
** test_chan_race.c: the channel's lock-free paths (chan.c) raced from
** two schedulers: the ring full and empty, the unbuffered spinner
** claimed while it withdraws, the spill's order, close racing sends,
** timeouts and cancels that must lose nothing, and elements that move
** with the channel's ops. Every check is on what arrives (each value
** once, each sender's values in order), never on timing; the watchdog
** turns a lost wake-up into a failure.
*/
#include "internal.h"
#include "sync-util.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* TSan runs each iteration several times slower. */
#if defined(__SANITIZE_THREAD__)
#define SCALE 10
#define STEP_SCALE 10
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SCALE 10
#define STEP_SCALE 10
#endif
#endif
#ifndef SCALE
#define SCALE 1
#define STEP_SCALE 1
#endif

static ums_runtime_t *rt;

/* A cheap per-task random number (xorshift). */
static uint32_t rnd(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

static void busy(uint32_t *s, uint32_t most) {
  uint32_t n = rnd(s) % (most + 1);
  for (volatile uint32_t i = 0; i < n; i++) {
  }
}

/* ---------------------------------------------------------------------- */
/* Streams: two producers, two consumers, one per scheduler each           */
/* ---------------------------------------------------------------------- */

#define PRODUCERS 2
#define CONSUMERS 2

typedef struct stream {
  ums_chan_t *ch;
  int n;                     /* values per producer */
  bool timeouts;             /* the second of each side uses deadlines */
  _Atomic uint8_t *seen;     /* [PRODUCERS * n] */
  _Atomic long got;
} stream_t;

typedef struct party {
  stream_t *st;
  int id;
} party_t;

static void *producer(void *arg) {
  party_t *p = arg;
  stream_t *st = p->st;
  uint32_t seed = 77u + (uint32_t)p->id;
  for (int i = 0; i < st->n; i++) {
    int64_t v = ((int64_t)p->id << 32) | i;
    if (st->timeouts && p->id == 1) {
      int r;
      while ((r = ums_chan_send(st->ch, &v,
                                ums_deadline((rnd(&seed) % 50) * US))) ==
             UMS_ETIMEDOUT) {
      }
      CHECK_OK(r);
    } else {
      CHECK_OK(ums_chan_send(st->ch, &v, UMS_FOREVER));
    }
    if ((i & 63) == 0) busy(&seed, 2000);
  }
  return NULL;
}

static void *consumer(void *arg) {
  party_t *p = arg;
  stream_t *st = p->st;
  uint32_t seed = 991u + (uint32_t)p->id;
  int64_t last[PRODUCERS];
  for (int i = 0; i < PRODUCERS; i++) last[i] = -1;
  for (;;) {
    int64_t v;
    int r;
    if (st->timeouts && p->id == 1)
      r = ums_chan_recv(st->ch, &v, ums_deadline((rnd(&seed) % 50) * US));
    else
      r = ums_chan_recv(st->ch, &v, UMS_FOREVER);
    if (r == UMS_ETIMEDOUT) continue;
    if (r == UMS_ECLOSED) break;
    CHECK_OK(r);
    int who = (int)(v >> 32);
    int64_t seq = v & 0xffffffff;
    CHECK(who >= 0 && who < PRODUCERS && seq < st->n);
    /* A consumer sees each producer's values in the order sent. */
    CHECK(seq > last[who]);
    last[who] = seq;
    CHECK_EQ(atomic_fetch_add(&st->seen[who * st->n + seq], 1), 0);
    atomic_fetch_add(&st->got, 1);
    if ((seq & 127) == 0) busy(&seed, 3000);
  }
  return NULL;
}

/* The same parties as step tasks, through the park-based calls: the
** operation in flight and its element live in the party, not on a stack
** (an unbuffered channel's other side moves the element while the task is
** parked). */
typedef struct step_party {
  stream_t *st;
  int id;
  bool sending;
  uint32_t seed;
  int i;                 /* values sent */
  int64_t v;             /* the element in flight */
  int64_t deadline;
  bool parked;           /* an operation's park has begun */
  int64_t last[PRODUCERS];
} step_party_t;

static int step_stream(void *arg) {
  step_party_t *p = arg;
  stream_t *st = p->st;
  for (int ops = 0; ops < 64; ops++) {
    if (p->sending && p->i == st->n) break;
    int r;
    if (!p->parked) {
      p->deadline = st->timeouts && p->id == 1
                        ? ums_deadline((rnd(&p->seed) % 50) * US)
                        : UMS_FOREVER;
      if (p->sending) p->v = ((int64_t)p->id << 32) | p->i;
      r = p->sending ? ums_chan_send_begin(st->ch, &p->v, p->deadline, NULL)
                     : ums_chan_recv_begin(st->ch, &p->v, p->deadline, NULL);
    } else {
      r = p->sending ? ums_chan_send_end(st->ch, &p->v, p->deadline, NULL)
                     : ums_chan_recv_end(st->ch, &p->v, p->deadline, NULL);
    }
    p->parked = r == 1;
    if (p->parked) return UMS_STEP_PARK;
    if (r == UMS_ETIMEDOUT) continue;
    if (p->sending) {
      CHECK_OK(r);
      p->i++;
      continue;
    }
    if (r == UMS_ECLOSED) {
      ums_step_set_result(NULL, 0);
      return UMS_STEP_DONE;
    }
    CHECK_OK(r);
    int who = (int)(p->v >> 32);
    int64_t seq = p->v & 0xffffffff;
    CHECK(who >= 0 && who < PRODUCERS && seq < st->n);
    CHECK(seq > p->last[who]);
    p->last[who] = seq;
    CHECK_EQ(atomic_fetch_add(&st->seen[who * st->n + seq], 1), 0);
    atomic_fetch_add(&st->got, 1);
  }
  if (p->sending && p->i == st->n) {
    ums_step_set_result(NULL, 0);
    return UMS_STEP_DONE;
  }
  return UMS_STEP_YIELD; /* let the scheduler's other tasks run */
}

/* With steps, the first producer and the first consumer are step tasks
** and the others fibers. */
static void stream(size_t cap, int n, bool timeouts, bool steps) {
  char what[80];
  snprintf(what, sizeof what, "stream cap %zu%s%s", cap,
           timeouts ? ", timeouts" : "", steps ? ", step tasks" : "");
  int64_t t0 = ums_now();
  su_watchdog_start(what, 100);
  stream_t st = {0};
  st.ch = ums_chan_new(sizeof(int64_t), cap);
  CHECK(st.ch != NULL);
  st.n = n;
  st.timeouts = timeouts;
  st.seen = calloc((size_t)(PRODUCERS * n), 1);
  party_t pp[PRODUCERS], cp[CONSUMERS];
  step_party_t sp[2];
  ums_task_t pt[PRODUCERS], ct[CONSUMERS];
  for (int i = 0; i < CONSUMERS; i++) {
    cp[i] = (party_t){&st, i};
    if (steps && i == 0) {
      sp[0] = (step_party_t){&st, i, false, 17u, 0, 0, 0, false, {-1, -1}};
      ct[i] = su_spawn_step(rt, i % 2, step_stream, &sp[0]);
    } else {
      ct[i] = su_spawn(rt, i % 2, consumer, &cp[i]);
    }
  }
  for (int i = 0; i < PRODUCERS; i++) {
    pp[i] = (party_t){&st, i};
    if (steps && i == 0) {
      sp[1] = (step_party_t){&st, i, true, 23u, 0, 0, 0, false, {-1, -1}};
      pt[i] = su_spawn_step(rt, (i + 1) % 2, step_stream, &sp[1]);
    } else {
      pt[i] = su_spawn(rt, (i + 1) % 2, producer, &pp[i]);
    }
  }
  for (int i = 0; i < PRODUCERS; i++) su_join(rt, pt[i]);
  CHECK_OK(ums_chan_close(st.ch));
  for (int i = 0; i < CONSUMERS; i++) su_join(rt, ct[i]);
  CHECK_EQ(atomic_load(&st.got), (long)PRODUCERS * n);
  CHECK_EQ(ums_chan_len(st.ch), 0);
  CHECK_OK(ums_chan_delete(st.ch));
  free(st.seen);
  su_watchdog_stop();
  printf("  %-46s ok (%.1f ms)\n", what, (double)(ums_now() - t0) / 1e6);
}

/* ---------------------------------------------------------------------- */
/* The unbuffered spinner: claimed as it withdraws                         */
/* ---------------------------------------------------------------------- */

/* Elements of one word, which a spinner holds itself, and of BIG_WORDS,
** beyond what it holds (chan.c SPIN_INLINE), which a sender moves
** straight into the receiver's memory. Word k of element i is i + k. */
#define BIG_WORDS 40

typedef struct spin_arg {
  ums_chan_t *ch;
  int n;
  int words;
} spin_arg_t;

/* Sends after pauses around the receiver's spin (a few microseconds), so
** that many sends claim the spinner just as its spin ends and it
** withdraws. */
static void *spin_sender(void *arg) {
  spin_arg_t *a = arg;
  uint32_t seed = 31337u;
  for (int64_t i = 0; i < a->n; i++) {
    int64_t e[BIG_WORDS];
    for (int k = 0; k < a->words; k++) e[k] = i + k;
    busy(&seed, 8000);
    CHECK_OK(ums_chan_send(a->ch, e, UMS_FOREVER));
  }
  return NULL;
}

/* A move that takes a while widens the window between a sender's claim
** of the spinner and its publishing the element. */
static void slow_move(void *dst, void *src) {
  uint32_t seed = 7u;
  busy(&seed, 2000);
  memcpy(dst, src, sizeof(int64_t));
}

static void slow_move_big(void *dst, void *src) {
  uint32_t seed = 7u;
  busy(&seed, 2000);
  memcpy(dst, src, BIG_WORDS * sizeof(int64_t));
}

static const ums_chan_ops_t slow_ops = {slow_move, NULL};
static const ums_chan_ops_t slow_big_ops = {slow_move_big, NULL};

static void spinner_races(int n, int words) {
  char what[80];
  snprintf(what, sizeof what,
           "unbuffered: spinner claimed as it withdraws, %d B", words * 8);
  int64_t t0 = ums_now();
  su_watchdog_start(what, 100);
  ums_chan_t *ch = ums_chan_new_ex(words * sizeof(int64_t), 0,
                                   words == 1 ? &slow_ops : &slow_big_ops);
  spin_arg_t a = {ch, n, words};
  ums_task_t t = su_spawn(rt, 1, spin_sender, &a);
  for (int64_t i = 0; i < n; i++) {
    /* A value from an earlier round would show a receive that returned
    ** before its element was moved in. */
    int64_t e[BIG_WORDS];
    for (int k = 0; k < words; k++) e[k] = -1;
    CHECK_OK(ums_chan_recv(ch, e, UMS_FOREVER));
    for (int k = 0; k < words; k++) CHECK_EQ(e[k], i + k);
  }
  su_join(rt, t);
  CHECK_OK(ums_chan_delete(ch));
  su_watchdog_stop();
  printf("  %-46s ok (%.1f ms)\n", what, (double)(ums_now() - t0) / 1e6);
}

/* ---------------------------------------------------------------------- */
/* Close racing sends                                                      */
/* ---------------------------------------------------------------------- */

#define CR_MAX 4096

typedef struct close_race {
  ums_chan_t *ch;
  int id;
  uint32_t seed;
  int sent;                  /* values whose send returned 0 */
} close_race_t;

static _Atomic uint8_t cr_seen[2][CR_MAX];

static void *cr_sender(void *arg) {
  close_race_t *c = arg;
  for (int i = 0; i < CR_MAX; i++) {
    int64_t v = ((int64_t)c->id << 32) | i;
    int r = ums_chan_send(c->ch, &v, UMS_FOREVER);
    if (r == UMS_ECLOSED) break;
    CHECK_OK(r);
    c->sent = i + 1;
    busy(&c->seed, 300);
  }
  return NULL;
}

static void *cr_receiver(void *arg) {
  close_race_t *c = arg;
  for (;;) {
    int64_t v;
    int r = ums_chan_recv(c->ch, &v, UMS_FOREVER);
    if (r == UMS_ECLOSED) break;
    CHECK_OK(r);
    int who = (int)(v >> 32), seq = (int)(v & 0xffffffff);
    CHECK(who >= 0 && who < 2 && seq < CR_MAX);
    CHECK_EQ(atomic_fetch_add(&cr_seen[who][seq], 1), 0);
    c->sent++;
    busy(&c->seed, 300);
  }
  return NULL;
}

/* Two senders (one per scheduler) and a receiver; the driver closes at a
** random moment. Every send that returned 0 was received exactly once,
** and nothing else was. */
static void close_races(size_t cap, int iters) {
  char what[80];
  snprintf(what, sizeof what, "close racing sends, cap %zu", cap);
  int64_t t0 = ums_now();
  su_watchdog_start(what, 100);
  uint32_t seed = 4242u + (uint32_t)cap;
  for (int it = 0; it < iters; it++) {
    memset(cr_seen, 0, sizeof cr_seen);
    ums_chan_t *ch = ums_chan_new(sizeof(int64_t), cap);
    close_race_t s[2], r;
    ums_task_t st[2], tr;
    for (int i = 0; i < 2; i++) {
      s[i] = (close_race_t){ch, i, rnd(&seed), 0};
      st[i] = su_spawn(rt, i, cr_sender, &s[i]);
    }
    r = (close_race_t){ch, 0, rnd(&seed), 0};
    tr = su_spawn(rt, it % 2, cr_receiver, &r);
    /* Close after a random while: sometimes before anything moved. */
    int yields = (int)(rnd(&seed) % 8);
    for (int i = 0; i < yields; i++) CHECK_OK(ums_yield());
    busy(&seed, 20000);
    CHECK_OK(ums_chan_close(ch));
    for (int i = 0; i < 2; i++) su_join(rt, st[i]);
    su_join(rt, tr);
    CHECK_EQ(r.sent, s[0].sent + s[1].sent);
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < CR_MAX; k++)
        CHECK_EQ(atomic_load(&cr_seen[i][k]), k < s[i].sent ? 1 : 0);
    CHECK_OK(ums_chan_delete(ch));
  }
  su_watchdog_stop();
  printf("  %-46s ok (%.1f ms)\n", what, (double)(ums_now() - t0) / 1e6);
}

/* ---------------------------------------------------------------------- */
/* Cancel and timeout lose nothing                                         */
/* ---------------------------------------------------------------------- */

typedef struct cancel_race {
  ums_chan_t *ch;
  int64_t v;
  int rc;
  _Atomic int started;
} cancel_race_t;

static void *cx_receiver(void *arg) {
  cancel_race_t *c = arg;
  atomic_store(&c->started, 1);
  c->rc = ums_chan_recv(c->ch, &c->v, UMS_FOREVER);
  return NULL;
}

/* The receiver as a step task: the park-based calls. */
typedef struct cx_step {
  cancel_race_t *c;
  bool parked;
} cx_step_t;

static int cx_step_receiver(void *arg) {
  cx_step_t *s = arg;
  cancel_race_t *c = s->c;
  int r;
  if (!s->parked) {
    atomic_store(&c->started, 1);
    r = ums_chan_recv_begin(c->ch, &c->v, UMS_FOREVER, NULL);
  } else {
    r = ums_chan_recv_end(c->ch, &c->v, UMS_FOREVER, NULL);
  }
  s->parked = r == 1;
  if (s->parked) return UMS_STEP_PARK;
  c->rc = r;
  ums_step_set_result(NULL, 0);
  return UMS_STEP_DONE;
}

/* A receiver on the other scheduler, cancelled while a value is sent to
** it: either it got the value, or the value is still to be had (buffered)
** or the send failed (unbuffered, with a deadline), never both and never
** neither. */
static void cancel_races(size_t cap, int iters) {
  char what[80];
  snprintf(what, sizeof what, "cancel racing a send, cap %zu", cap);
  int64_t t0 = ums_now();
  su_watchdog_start(what, 100);
  ums_chan_t *ch = ums_chan_new(sizeof(int64_t), cap);
  uint32_t seed = 5150u;
  int got = 0, kept = 0;
  for (int it = 0; it < iters; it++) {
    cancel_race_t c = {ch, -1, 1, 0};
    cx_step_t cs = {&c, false};
    /* Every other pair of rounds, the receiver is a step task. */
    ums_task_t t = (it / 2) % 2 ? su_spawn_step(rt, 1, cx_step_receiver, &cs)
                                : su_spawn(rt, 1, cx_receiver, &c);
    su_await(&c.started, 1);
    busy(&seed, 5000);
    int64_t v = it;
    int sr;
    if (it % 2) {
      CHECK_OK(ums_task_cancel(rt, t));
      sr = ums_chan_send(ch, &v, ums_deadline(200 * US));
    } else {
      sr = ums_chan_send(ch, &v, ums_deadline(200 * US));
      CHECK_OK(ums_task_cancel(rt, t));
    }
    void *res;
    int status;
    CHECK_OK(ums_task_join(rt, t, ums_deadline(30 * UMS_NSEC_PER_SEC), &res,
                           &status));
    int64_t left = -1;
    int lr = ums_chan_try_recv(ch, &left);
    if (c.rc == 0) {
      /* The receiver took it: the send succeeded, nothing is left. */
      CHECK_EQ(c.v, it);
      CHECK_OK(sr);
      CHECK_EQ(lr, UMS_EAGAIN);
      got++;
    } else {
      CHECK(c.rc == UMS_ECANCELED || c.rc == 1);
      if (sr == 0) {
        CHECK_OK(lr); /* only a buffered channel keeps it */
        CHECK_EQ(left, it);
        kept++;
      } else {
        CHECK_EQ(sr, UMS_ETIMEDOUT);
        CHECK_EQ(lr, UMS_EAGAIN);
      }
    }
  }
  CHECK_OK(ums_chan_delete(ch));
  su_watchdog_stop();
  printf("  %-46s ok (%.1f ms; %d taken, %d kept)\n", what,
         (double)(ums_now() - t0) / 1e6, got, kept);
}

/* ---------------------------------------------------------------------- */
/* Elements that move with ops                                             */
/* ---------------------------------------------------------------------- */

/* Points at its own inline bytes, as an encoded Lua value does: a
** memcpy would leave p pointing into the sender's copy. */
typedef struct selfref {
  char *p;
  int64_t seq;
  char inl[24];
} selfref_t;

static _Atomic long sr_cleared;

static void sr_move(void *dst, void *src) {
  selfref_t *d = dst, *s = src;
  d->seq = s->seq;
  memcpy(d->inl, s->inl, sizeof d->inl);
  d->p = d->inl;
  s->p = NULL; /* forgotten: a use of it after the move faults */
}

static void sr_clear(void *e) {
  selfref_t *s = e;
  CHECK(s->p == s->inl);
  atomic_fetch_add(&sr_cleared, 1);
}

static const ums_chan_ops_t sr_ops = {sr_move, sr_clear};

static void sr_make(selfref_t *s, int64_t seq) {
  s->seq = seq;
  snprintf(s->inl, sizeof s->inl, "v%lld", (long long)seq);
  s->p = s->inl;
}

typedef struct sr_arg {
  ums_chan_t *ch;
  int n;
} sr_arg_t;

static void *sr_producer(void *arg) {
  sr_arg_t *a = arg;
  for (int i = 0; i < a->n; i++) {
    selfref_t s;
    sr_make(&s, i);
    CHECK_OK(ums_chan_send(a->ch, &s, UMS_FOREVER));
  }
  return NULL;
}

static void moved_elements(size_t cap, int n) {
  char what[80];
  snprintf(what, sizeof what, "elements moved by ops, cap %zu", cap);
  su_watchdog_start(what, 100);
  ums_chan_t *ch = ums_chan_new_ex(sizeof(selfref_t), cap, &sr_ops);
  CHECK(ch != NULL);
  sr_arg_t a = {ch, n};
  ums_task_t t = su_spawn(rt, 1, sr_producer, &a);
  for (int i = 0; i < n; i++) {
    selfref_t s;
    CHECK_OK(ums_chan_recv(ch, &s, UMS_FOREVER));
    CHECK(s.p == s.inl);
    CHECK_EQ(s.seq, i);
    char want[24];
    snprintf(want, sizeof want, "v%d", i);
    CHECK(strcmp(s.p, want) == 0);
  }
  su_join(rt, t);
  /* Elements left inside are cleared at delete, the spill's included. */
  atomic_store(&sr_cleared, 0);
  long left = cap < 300 ? (long)cap : 300;
  for (long i = 0; i < left; i++) {
    selfref_t s;
    sr_make(&s, i);
    CHECK_OK(ums_chan_try_send(ch, &s));
  }
  CHECK_EQ(ums_chan_len(ch), (size_t)left);
  CHECK_OK(ums_chan_delete(ch));
  CHECK_EQ(atomic_load(&sr_cleared), left);
  su_watchdog_stop();
  printf("  %-46s ok\n", what);
}

/* ---------------------------------------------------------------------- */

static void *driver(void *unused) {
  int n = 20000 / SCALE;
  spinner_races(n, 1);
  spinner_races(n / 4, BIG_WORDS);
  for (int steps = 0; steps < 2; steps++) {
    /* Step tasks' parks are far slower under TSan than fibers' waits. */
    if (steps) n /= STEP_SCALE;
    stream(0, n, false, steps);  /* the spinner, claimed while it withdraws */
    stream(1, n, false, steps);  /* the ring full and empty at every value */
    stream(4, n, false, steps);
    stream(300, n, false, steps); /* beyond the ring: the spill */
    stream(0, n / 4, true, steps);
    stream(4, n / 4, true, steps);
    stream(300, n / 4, true, steps);
  }
  close_races(0, 400 / SCALE);
  close_races(2, 400 / SCALE);
  close_races(300, 400 / SCALE);
  cancel_races(0, 2000 / SCALE);
  cancel_races(1, 2000 / SCALE);
  moved_elements(0, 5000 / SCALE);
  moved_elements(4, 5000 / SCALE);
  moved_elements(600, 5000 / SCALE);
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("test_chan_race: 2 schedulers\n");
  rt = su_runtime(2, 0);
  /* Each part has its own watchdog; the driver's join only bounds the
  ** whole, which a loaded machine under TSan makes long. */
  void *res;
  int status = -1;
  CHECK_OK(ums_task_join(rt, su_spawn(rt, 0, driver, NULL),
                         ums_deadline(600 * UMS_NSEC_PER_SEC), &res,
                         &status));
  CHECK_EQ(status, 0);
  su_teardown(rt);
  printf("test_chan_race: ok\n");
  return 0;
}
