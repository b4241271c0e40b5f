/*
** lcdata.h: ums.ffi's memory seen from Lua (lcdata.c): buffers, which
** own reference-counted memory a call may read or write, and pointers,
** which own nothing.
*/
#ifndef LCDATA_H
#define LCDATA_H

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

/* Pushes p as an ums.ffi.pointer, or nil for NULL. */
LUMS_HIDDEN void lffi_push_ptr(lua_State *L, void *p);

/* Creates the buffer and pointer metatables and adds buffer and string to
** the ffi table at the top. */
LUMS_HIDDEN void lffi_open_cdata(lua_State *L);

#endif
