/*
** lproxy.h: objects any VM may use (ums.shared.*): reference counted C
** structs, one proxy userdata per VM (lproxy.c), waits that park the
** task and wake-ups that go through the runtime's unpark, so that a task
** of another scheduler is woken through its completion list; the kinds
** themselves are lshared.c's.
*/
#ifndef LPROXY_H
#define LPROXY_H

#include "lcopy.h"

#include <pthread.h>

/* ====================================================================== */
/* Shared objects (lproxy.c: objects and proxies; lshared.c: the kinds)    */
/* ====================================================================== */

typedef struct lshared_kind {
  const char *name;            /* __name of the proxies, "ums.shared.x" */
  void (*destroy)(lshared *o); /* the last reference is gone: free o */
  const luaL_Reg *methods;     /* methods of the proxies */
} lshared_kind;

/* The header of every shared object. refs counts the proxies (one per VM
** that has the object, however many Lua references point to it there),
** the messages that name it, and whatever else holds it; the last
** lshared_unref calls kind->destroy on whatever thread drops it. */
struct lshared {
  const lshared_kind *kind;    /* [const] */
  _Atomic uint32_t refs;       /* [atomic] */
  pthread_mutex_t lock;        /* guards the kind's own state */
};

/* Fills the header of a zeroed object made in C (no proxy): refs 1. */
LUMS_HIDDEN void lshared_init(lshared *o, const lshared_kind *k);
LUMS_HIDDEN void lshared_ref(lshared *o);
LUMS_HIDDEN void lshared_unref(lshared *o);
/* The shared object at idx of L, or NULL. */
LUMS_HIDDEN lshared *lshared_test(lua_State *L, int idx);
/* The object of kind k at idx, or raises "bad argument ... (k->name
** expected, got ...)" naming fname. */
LUMS_HIDDEN lshared *lshared_check(lua_State *L, int idx,
                                   const lshared_kind *k, const char *fname);
/* Pushes L's proxy for o: the one L already has, or a new one holding a
** reference of its own. */
LUMS_HIDDEN void lshared_push(lua_State *L, lshared *o);
/* Creates a zeroed object of `size` bytes (struct lshared first) and
** pushes its proxy, which holds its only reference. Raises when out of
** memory. */
LUMS_HIDDEN void *lshared_new(lua_State *L, size_t size,
                              const lshared_kind *k);
/* Creates kind k's proxy metatable in L's VM (each VM, at luaopen). */
LUMS_HIDDEN void lshared_register(lua_State *L, const lshared_kind *k);
/* Creates L's VM's proxy cache (each VM, at luaopen, before any proxy). */
LUMS_HIDDEN void lshared_open_proxies(lua_State *L);

/* ums.shared.channel([size]) (lshared.c), for lchan.c's
** channel{shared = true}. */
LUMS_HIDDEN int lums_shared_channel(lua_State *L);

#endif
