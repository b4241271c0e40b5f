/*
** lcopy.h: values copied out of one VM into a C buffer and from there
** into another VM (lcopy.c), so that no VM touches another's memory;
** the same buffers carry a C host's values (ums_lua_value_t).
*/
#ifndef LCOPY_H
#define LCOPY_H

#include "lums.h"

#include "ums-lua.h"

typedef struct lshared lshared;

/* Encoded values in C memory: no Lua object, so any thread may hold,
** move and free it. Whoever holds the pointer owns it (a request, a
** channel's buffer, a waiter) and frees it with lcopy_free. */
#define LMSG_INLINE 48
typedef struct lmsg {
  char *data;            /* the encoding: inl or malloc'ed */
  size_t len, cap;
  lshared **refs;        /* shared objects named by the values, one
                            reference each, dropped by lcopy_free */
  uint32_t nrefs, caprefs;
  int nvalues;
  uint32_t nids;         /* tables and functions in it */
  char inl[LMSG_INLINE];
} lmsg;

/* Encodes the n values from index first of L. nil, booleans, integers
** and floats (kept apart), strings, tables (nested; shared references and
** cycles kept) without metatables, Lua functions whose only upvalue is
** _ENV (as bytecode; _ENV becomes the receiving VM's globals) and shared
** objects (by reference). For anything else returns NULL, sets *bad to
** the position (0-based) of the top-level value it is in, and writes
** "<root><path>: <what it is>" into err, e.g.
** "args[2].config.callback: function with upvalues (n)". The root is
** root[i] for the i-th value, or root alone when `indexed` is false.
** Raises only for memory errors, freeing what it built. */
LUMS_HIDDEN lmsg *lcopy_encode(lua_State *L, int first, int n,
                               const char *root, bool indexed, char *err,
                               size_t errsz, int *bad);
/* Encodes the n values from index first into m (the caller's memory)
** when they are all nil, booleans, numbers or strings, and returns true;
** returns false, m untouched, for anything else. Raises only for memory
** errors, with nothing left in m. */
LUMS_HIDDEN bool lcopy_encode_scalars(lua_State *L, int first, int n,
                                      lmsg *m);
/* Pushes fresh copies of m's values onto L and returns their number. m
** is left as it was (it may be decoded again). Raises on memory errors. */
LUMS_HIDDEN int lcopy_decode(lua_State *L, const lmsg *m);
/* The same, then frees m, also when decoding raises. */
LUMS_HIDDEN int lcopy_decode_free(lua_State *L, lmsg *m);
/* The same for a message in the caller's memory: releases what m holds
** (not m itself), also when decoding raises. */
LUMS_HIDDEN int lcopy_decode_clear(lua_State *L, lmsg *m);
/* Frees m and drops its references. NULL is ignored. Any thread. */
LUMS_HIDDEN void lcopy_free(lmsg *m);
/* Releases what m holds (its data and references), not m itself: for a
** message in the caller's memory. Any thread. */
LUMS_HIDDEN void lcopy_clear(lmsg *m);
/* Moves the message src into dst (both the caller's memory): dst owns
** what src held, and src is to be forgotten, not cleared. */
LUMS_HIDDEN void lcopy_move(lmsg *dst, lmsg *src);

/* A C host's values (ums_lua_value_t, trees of nil, booleans, integers,
** floats, strings and tables) to a message, without a VM: NULL with err
** set to "<root>[i]<path>: <why>" for a bad value (an unknown type, a nil
** or NaN key) or "out of memory". Any thread. */
LUMS_HIDDEN lmsg *lcopy_from_values(const ums_lua_value_t *v, int n,
                                    const char *root, char *err,
                                    size_t errsz);
/* A message to the host's values: 0 with *out (m->nvalues values, NULL
** when none; the caller frees each and the array) or -1 with err set:
** functions and shared objects cannot reach the host, nor a table that
** contains itself. A table met twice without a cycle is copied twice.
** Any thread. */
LUMS_HIDDEN int lcopy_to_values(const lmsg *m, ums_lua_value_t **out,
                                const char *root, char *err, size_t errsz);

#endif
