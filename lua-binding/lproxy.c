/*
** lproxy.c: shared objects and their proxies, what every kind of lshared.c
** is built on and what lcopy.c copies between VMs. An object is a C
** struct (struct lshared first) with an atomic reference count; each VM
** that has it holds one proxy userdata for it (a weak table per VM maps
** objects to proxies, so an object has one identity inside a VM, however
** often it arrives), and the proxy holds one reference.
*/
#include "lproxy.h"

#include <stdlib.h>

/* Every proxy starts with this address (see lchan.c's chan_tag). */
static const char proxy_tag = 0;
/* Registry key of the VM's weak table object -> proxy. */
static const char proxies_key = 0;

typedef struct proxy {
  const char *tag;       /* &proxy_tag */
  lshared *o;            /* one reference; NULL until taken */
} proxy;

/* ---------------------------------------------------------------------- */
/* Objects and proxies                                                     */
/* ---------------------------------------------------------------------- */

void lshared_init(lshared *o, const lshared_kind *k) {
  o->kind = k;
  atomic_init(&o->refs, 1);
  pthread_mutex_init(&o->lock, NULL);
}

void lshared_ref(lshared *o) {
  atomic_fetch_add_explicit(&o->refs, 1, memory_order_relaxed);
}

void lshared_unref(lshared *o) {
  if (atomic_fetch_sub_explicit(&o->refs, 1, memory_order_acq_rel) == 1) {
    pthread_mutex_destroy(&o->lock);
    o->kind->destroy(o);
  }
}

lshared *lshared_test(lua_State *L, int idx) {
  proxy *p = (proxy *)lua_touserdata(L, idx);
  if (!p || lua_rawlen(L, idx) != sizeof *p || p->tag != &proxy_tag)
    return NULL;
  return p->o;
}

lshared *lshared_check(lua_State *L, int idx, const lshared_kind *k,
                       const char *fname) {
  lshared *o = lshared_test(L, idx);
  if (!o || o->kind != k) lums_typeerr(L, idx, fname, k->name);
  return o;
}

/* Pushes a proxy of kind k that holds no object yet. */
static proxy *new_proxy(lua_State *L, const lshared_kind *k) {
  proxy *p = (proxy *)lua_newuserdatauv(L, sizeof *p, 0);
  p->tag = &proxy_tag;
  p->o = NULL;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, k) != LUA_TTABLE)
    luaL_error(L, "ums: %s is not registered in this VM", k->name);
  lua_setmetatable(L, -2);
  return p;
}

/* Remembers the proxy on top as L's proxy for o. */
static void cache_proxy(lua_State *L, lshared *o) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &proxies_key);
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, o);
  lua_pop(L, 1);
}

void lshared_push(lua_State *L, lshared *o) {
  luaL_checkstack(L, 3, "too many values");
  lua_rawgetp(L, LUA_REGISTRYINDEX, &proxies_key);
  if (lua_rawgetp(L, -1, o) == LUA_TUSERDATA) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 2);
  proxy *p = new_proxy(L, o->kind);
  lshared_ref(o);
  p->o = o;
  cache_proxy(L, o);
}

void *lshared_new(lua_State *L, size_t size, const lshared_kind *k) {
  /* The proxy first: if Lua runs out of memory, nothing leaks. */
  proxy *p = new_proxy(L, k);
  lshared *o = calloc(1, size);
  if (!o) luaL_error(L, "ums: out of memory");
  lshared_init(o, k);
  p->o = o;
  cache_proxy(L, o);
  return o;
}

static int proxy_gc(lua_State *L) {
  proxy *p = (proxy *)lua_touserdata(L, 1);
  if (p && p->o) {
    lshared *o = p->o;
    p->o = NULL;
    lshared_unref(o);
  }
  return 0;
}

static int proxy_tostring(lua_State *L) {
  lshared *o = lshared_test(L, 1);
  if (!o) return luaL_error(L, "ums: not a shared object");
  lua_pushfstring(L, "%s (%p)", o->kind->name, (void *)o);
  return 1;
}

void lshared_register(lua_State *L, const lshared_kind *k) {
  lua_createtable(L, 0, 4);
  lua_newtable(L);
  luaL_setfuncs(L, k->methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, k->name);
  lua_setfield(L, -2, "__name");
  lua_pushcfunction(L, proxy_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, proxy_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_rawsetp(L, LUA_REGISTRYINDEX, k);
}

void lshared_open_proxies(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &proxies_key) != LUA_TTABLE) {
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &proxies_key);
  }
  lua_pop(L, 1);
}
