/*
** test_lalloc.c: a VM whose allocator refuses an allocation while the
** VM's cache of freed blocks (lalloc.c) holds the room it needs gets its
** allocation all the same: the cache gives its blocks back to the
** allocator underneath and the allocation is tried again. (Lua's own
** retry after an emergency collection does not help there: the
** collection frees into the cache, not into the allocator underneath.)
*/
#define _GNU_SOURCE
#include "lalloc.h"
#include "test-util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The allocator underneath: malloc with a bound on the bytes it has
** handed out and not had back. */
typedef struct bounded {
  size_t used, limit;
} bounded_t;

static void *bounded_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  bounded_t *b = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    b->used -= old;
    return NULL;
  }
  if (nsize > old && b->used - old + nsize > b->limit) return NULL;
  void *p = realloc(ptr, nsize);
  if (p) b->used = b->used - old + nsize;
  return p;
}

/* A block larger than any the cache keeps, so that the cache cannot
** serve it from its own lists. */
static int new_big(lua_State *L) {
  lua_newuserdatauv(L, 4096, 0);
  return 0;
}

#define GARBAGE 20000

static void test_refused_allocation_flushes(void) {
  bounded_t b = {0, SIZE_MAX};
  lua_State *L = lua_newstate(bounded_alloc, &b);
  CHECK(L != NULL);
  lalloc *a = lums_alloc_install(L);
  CHECK(a != NULL);
  /* Small tables, all live at once, then collected: their blocks wait
  ** in the cache, still counted by the allocator underneath. */
  lua_createtable(L, GARBAGE, 0);
  for (int i = 1; i <= GARBAGE; i++) {
    lua_newtable(L);
    lua_rawseti(L, -2, i);
  }
  lua_pop(L, 1);
  /* A protected call once before the bound, so that the next one needs
  ** no new call record; its block is collected with the tables (too big
  ** for the cache, it goes back at once). */
  lua_pushcfunction(L, new_big);
  CHECK_EQ(lua_pcall(L, 0, 0, 0), LUA_OK);
  lua_gc(L, LUA_GCCOLLECT);
  size_t held = b.used;
  /* Nothing more from the allocator underneath than it has handed out,
  ** most of it the cache's. */
  b.limit = held;
  lua_pushcfunction(L, new_big);
  CHECK_EQ(lua_pcall(L, 0, 0, 0), LUA_OK);
  /* The cache went back: far fewer bytes are out than before. */
  CHECK_LT(b.used + GARBAGE * 32, held);
  b.limit = SIZE_MAX;
  lums_alloc_remove(L, a);
  lua_close(L);
  CHECK_EQ(b.used, 0);
}

int main(void) {
  RUN(test_refused_allocation_flushes);
  printf("test_lalloc: ok\n");
  return 0;
}
