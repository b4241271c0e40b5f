/*
** lccb.h: ums.ffi's callbacks (lccb.c), Lua functions called from C
** through libffi closures, during inline calls only.
*/
#ifndef LCCB_H
#define LCCB_H

#include "lcdecl.h"

#define LFFI_CB_MT "ums.ffi.callback"

/* An inline call in progress on this thread, during which callbacks may
** run Lua on L (the calling Lua thread, inside the call). On the calling
** thread's stack. */
typedef struct lcbframe {
  lua_State *L;
  struct lcbframe *prev;   /* the call this one is nested in */
  int err;                 /* registry reference to the first error a
                              callback raised, LUA_NOREF if none */
  bool failed;             /* a callback raised: later ones return 0 */
} lcbframe;

/* Around an inline call: callbacks reached during it run on L. leave
** raises the first error a callback raised, once the call returned. */
LUMS_HIDDEN void lffi_cb_enter(lcbframe *fr, lua_State *L);
LUMS_HIDDEN void lffi_cb_leave(lcbframe *fr);

/* The code address of the callback at idx (a callback object, or a Lua
** function made into a callback for the function pointer type t, left on
** the stack until it is collected); NULL when idx is neither. Raises for a
** freed callback, or a function where t has no signature. */
LUMS_HIDDEN void *lffi_cb_code(lua_State *L, int idx, const ctype *t);

/* Pushes a callback object for the Lua function at idx, of the function
** pointer type t (ffi.cast). Raises when t cannot take a callback. */
LUMS_HIDDEN void lffi_cb_new(lua_State *L, const ctype *t, int idx);

/* Creates the callback metatable. */
LUMS_HIDDEN void lffi_open_cb(lua_State *L);

#endif
