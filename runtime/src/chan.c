/*
** chan.c: channels of fixed-size elements, buffered or not.
**
** Values move under the channel's lock, straight between the parties when
** one is already waiting: a sender finding a parked receiver copies into
** the receiver's memory (w->data) and grants it; a receiver finding a
** parked sender copies out of the sender's memory. With a buffer, a
** receiver that frees a slot refills it from the first parked sender, so
** FIFO order holds across the buffer and the send queue.
*/
#include "internal.h"

#include <stdlib.h>
#include <string.h>

struct ums_chan {
  ums__lock_t lock;
  size_t elem;          /* [const] element size */
  size_t cap;           /* [const] buffer capacity in elements */
  size_t head, count;   /* [lock] ring buffer */
  bool closed;          /* [lock] */
  ums__wq_t sendq;      /* [lock] w->data: the value to send */
  ums__wq_t recvq;      /* [lock] w->data: where to put the value */
  unsigned char *buf;   /* [lock] cap * elem bytes */
};

ums_chan_t *ums_chan_new(size_t elem_size, size_t capacity) {
  if (elem_size && capacity > SIZE_MAX / elem_size) return NULL;
  ums_chan_t *ch = calloc(1, sizeof *ch);
  if (!ch) return NULL;
  ch->elem = elem_size;
  ch->cap = capacity;
  if (capacity && elem_size) {
    ch->buf = malloc(capacity * elem_size);
    if (!ch->buf) {
      free(ch);
      return NULL;
    }
  }
  return ch;
}

int ums_chan_delete(ums_chan_t *ch) {
  if (!ch) return UMS_EINVAL;
  ums__lock(&ch->lock);
  bool busy = ch->sendq.n || ch->recvq.n;
  ums__unlock(&ch->lock);
  if (busy) return UMS_EBUSY;
  free(ch->buf);
  free(ch);
  return 0;
}

static inline unsigned char *slot(ums_chan_t *ch, size_t i) {
  /* Zero-size elements have no buffer: no arithmetic on a null pointer. */
  if (!ch->buf) return NULL;
  return ch->buf + ((ch->head + i) % ch->cap) * ch->elem;
}

static inline void copy(void *dst, const void *src, size_t n) {
  if (n) memcpy(dst, src, n);
}

/* Completes a send without waiting if possible. Returns 0, UMS_ECLOSED or
** UMS_EAGAIN (would wait); on 0 *wk may hold a receiver to wake. Call with
** the lock held. */
static int send_now(ums_chan_t *ch, const void *elem, ums__wake_t *wk,
                    bool *wake) {
  *wake = false;
  if (ch->closed) return UMS_ECLOSED;
  ums__waiter_t *r = ums__wq_first(&ch->recvq);
  if (r) {
    copy(r->data, elem, ch->elem);
    *wake = ums__waiter_finish(r, 0, wk);
    return 0;
  }
  if (ch->count < ch->cap) {
    copy(slot(ch, ch->count), elem, ch->elem);
    ch->count++;
    return 0;
  }
  return UMS_EAGAIN;
}

/* The receive counterpart. */
static int recv_now(ums_chan_t *ch, void *elem, ums__wake_t *wk,
                    bool *wake) {
  *wake = false;
  ums__waiter_t *s = ums__wq_first(&ch->sendq);
  if (ch->count) {
    copy(elem, slot(ch, 0), ch->elem);
    ch->head = (ch->head + 1) % ch->cap;
    ch->count--;
    if (s) {
      copy(slot(ch, ch->count), s->data, ch->elem);
      ch->count++;
      *wake = ums__waiter_finish(s, 0, wk);
    }
    return 0;
  }
  if (s) {
    copy(elem, s->data, ch->elem);
    *wake = ums__waiter_finish(s, 0, wk);
    return 0;
  }
  return ch->closed ? UMS_ECLOSED : UMS_EAGAIN;
}

int ums_chan_send(ums_chan_t *ch, const void *elem, int64_t deadline) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  ums__wake_t wk;
  bool wake;
  ums__lock(&ch->lock);
  int r = send_now(ch, elem, &wk, &wake);
  if (r != UMS_EAGAIN) {
    ums__unlock(&ch->lock);
    if (wake) ums__wake(&wk);
    return r;
  }
  ums__waiter_t w;
  if ((r = ums__waiter_init(&w, &ch->sendq, &ch->lock)) != 0) {
    ums__unlock(&ch->lock);
    return r;
  }
  w.data = (void *)elem;
  w.type = UMS_WAIT_CHAN_SEND;
  w.obj = ch;
  ums__wq_push(&ch->sendq, &w);
  return ums__wait(&w, deadline);
}

int ums_chan_recv(ums_chan_t *ch, void *elem, int64_t deadline) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  ums__wake_t wk;
  bool wake;
  ums__lock(&ch->lock);
  int r = recv_now(ch, elem, &wk, &wake);
  if (r != UMS_EAGAIN) {
    ums__unlock(&ch->lock);
    if (wake) ums__wake(&wk);
    return r;
  }
  ums__waiter_t w;
  if ((r = ums__waiter_init(&w, &ch->recvq, &ch->lock)) != 0) {
    ums__unlock(&ch->lock);
    return r;
  }
  w.data = elem;
  w.type = UMS_WAIT_CHAN_RECV;
  w.obj = ch;
  ums__wq_push(&ch->recvq, &w);
  return ums__wait(&w, deadline);
}

int ums_chan_try_send(ums_chan_t *ch, const void *elem) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  ums__wake_t wk;
  bool wake;
  ums__lock(&ch->lock);
  int r = send_now(ch, elem, &wk, &wake);
  ums__unlock(&ch->lock);
  if (wake) ums__wake(&wk);
  return r;
}

int ums_chan_try_recv(ums_chan_t *ch, void *elem) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  ums__wake_t wk;
  bool wake;
  ums__lock(&ch->lock);
  int r = recv_now(ch, elem, &wk, &wake);
  ums__unlock(&ch->lock);
  if (wake) ums__wake(&wk);
  return r;
}

int ums_chan_close(ums_chan_t *ch) {
  if (!ch) return UMS_EINVAL;
  ums__lock(&ch->lock);
  if (ch->closed) {
    ums__unlock(&ch->lock);
    return UMS_ECLOSED;
  }
  ch->closed = true;
  /* Parked receivers imply an empty buffer; parked senders never get in.
  ** Both learn of the close now. A woken party may free the channel, so
  ** the wake-ups run after the last touch of it. */
  ums__wakelist_t wl;
  ums__wakelist_init(&wl);
  ums__wq_grant_all(&ch->recvq, UMS_ECLOSED, &wl);
  ums__wq_grant_all(&ch->sendq, UMS_ECLOSED, &wl);
  ums__unlock(&ch->lock);
  ums__wakelist_run(&wl);
  return 0;
}

size_t ums_chan_len(ums_chan_t *ch) {
  if (!ch) return 0;
  ums__lock(&ch->lock);
  size_t n = ch->count;
  ums__unlock(&ch->lock);
  return n;
}

size_t ums_chan_cap(ums_chan_t *ch) { return ch ? ch->cap : 0; }
