/*
** ums-list.h: the intrusive doubly linked list every queue of ums that
** must unlink from its middle is built on (waiters, pending tasks, idle
** workers, stack slabs, sockets in the epoll set, the binding's queues).
**
** Not installed: the runtime and the Lua binding share it. An element
** embeds a ums_link_t and is found from it with UMS_CONTAINER_OF. The
** list is NULL-terminated at both ends, so that a walk stops on NULL and
** an unlinked element's links read NULL. A list and its elements are
** guarded by whatever guards the queue they make: each embedding struct
** says which lock or thread that is next to its ums_list_t.
*/
#ifndef UMS_LIST_H
#define UMS_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ums_link {
  struct ums_link *prev, *next;
} ums_link_t;

typedef struct ums_list {
  ums_link_t *head, *tail;
} ums_list_t;

/* The struct of type `type` whose member `member` is the link at p. */
#define UMS_CONTAINER_OF(p, type, member) \
  ((type *)(void *)((char *)(p) - offsetof(type, member)))

/* The element holding link p, or NULL when p is NULL (the end of a walk). */
#define UMS_LIST_ENTRY(p, type, member) \
  ((p) ? UMS_CONTAINER_OF(p, type, member) : (type *)NULL)

static inline void ums_list_init(ums_list_t *l) { l->head = l->tail = NULL; }

static inline bool ums_list_empty(const ums_list_t *l) {
  return l->head == NULL;
}

static inline void ums_list_push_back(ums_list_t *l, ums_link_t *e) {
  e->next = NULL;
  e->prev = l->tail;
  if (l->tail)
    l->tail->next = e;
  else
    l->head = e;
  l->tail = e;
}

static inline void ums_list_push_front(ums_list_t *l, ums_link_t *e) {
  e->prev = NULL;
  e->next = l->head;
  if (l->head)
    l->head->prev = e;
  else
    l->tail = e;
  l->head = e;
}

/* Links e in just after at, which is on l. */
static inline void ums_list_insert_after(ums_list_t *l, ums_link_t *at,
                                         ums_link_t *e) {
  e->prev = at;
  e->next = at->next;
  if (at->next)
    at->next->prev = e;
  else
    l->tail = e;
  at->next = e;
}

/* Unlinks e, which must be on l; its links read NULL afterwards. */
static inline void ums_list_remove(ums_list_t *l, ums_link_t *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    l->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    l->tail = e->prev;
  e->prev = e->next = NULL;
}

/* Unlinks and returns the first element's link, or NULL if l is empty. */
static inline ums_link_t *ums_list_pop_front(ums_list_t *l) {
  ums_link_t *e = l->head;
  if (e) ums_list_remove(l, e);
  return e;
}

#endif
