/*
** lcdata.h: ums.ffi's memory seen from Lua (lcdata.c): cdata and buffers,
** which own reference-counted memory a call may read or write, and
** pointers, which own nothing.
*/
#ifndef LCDATA_H
#define LCDATA_H

#include "lcdecl.h"
#include "lums.h"

#define LFFI_BUF_MT "ums.ffi.buffer"
#define LFFI_PTR_MT "ums.ffi.pointer"

typedef struct lbuf {
  ums_buf_t *b;            /* one reference, dropped at __gc */
  size_t size;
} lbuf;

typedef struct lptr {
  void *p;
} lptr;

static inline lbuf *lffi_to_buf(lua_State *L, int idx) {
  return (lbuf *)luaL_testudata(L, idx, LFFI_BUF_MT);
}

static inline lptr *lffi_to_ptr(lua_State *L, int idx) {
  return (lptr *)luaL_testudata(L, idx, LFFI_PTR_MT);
}

/* A cdata: an object of type t at p, inside b. Its first member is its
** type (lcdecl.c's ffi.sizeof and typeof read it; see LFFI_CDATA_MT). */
typedef struct lcdata {
  const ctype *t;
  ums_buf_t *b;            /* one reference, dropped at __gc */
  char *p;                 /* within b's data */
} lcdata;

/* The cdata at idx, or NULL. Inline, as the two above: the callbacks
** (lccb.c) read values this way without depending on the operations of
** lcdata.c, which make callbacks. */
static inline lcdata *lffi_to_cdata(lua_State *L, int idx) {
  return (lcdata *)luaL_testudata(L, idx, LFFI_CDATA_MT);
}

/* Pushes a new zero-filled cdata of the complete type t; raises when out
** of memory. */
LUMS_HIDDEN lcdata *lffi_new_cdata(lua_State *L, const ctype *t);

/* Pushes a cdata of type t over all of b, taking over the caller's
** reference on b. */
LUMS_HIDDEN lcdata *lffi_push_cdata_buf(lua_State *L, const ctype *t,
                                        ums_buf_t *b);

/* Stores the Lua value at idx as a t at q, as an assignment to a cdata
** does; raises "what (why)" when it does not fit. */
LUMS_HIDDEN void lffi_store(lua_State *L, int idx, const ctype *t, char *q,
                            const char *what);

/* Pushes p as an ums.ffi.pointer, or nil for NULL. */
static inline void lffi_push_ptr(lua_State *L, void *p) {
  if (!p) {
    lua_pushnil(L);
    return;
  }
  lptr *u = (lptr *)lua_newuserdatauv(L, sizeof *u, 0);
  u->p = p;
  luaL_setmetatable(L, LFFI_PTR_MT);
}

/* Creates the cdata, buffer and pointer metatables and adds new, buffer,
** string, copy, fill and istype to the ffi table at the top. */
LUMS_HIDDEN void lffi_open_cdata(lua_State *L);

/* The I/O buffer behind the ums.ffi.buffer at idx, storing its
** size in *size; NULL for any other value. The userdata owns one
** reference, dropped when it is collected: a caller that hands the buffer
** to a request that may outlive the call takes its own (the runtime's
** requests do, ums.h "Ownership"). */
LUMS_HIDDEN ums_buf_t *lums_test_buf(lua_State *L, int idx, size_t *size);

#endif
