/*
** lcconv.h: ums.ffi's conversions between Lua values and C values
** (lcconv.c), the marshalling of a call's arguments and its result.
*/
#ifndef LCCONV_H
#define LCCONV_H

#include "lcdecl.h"

typedef union cval {
  int8_t i8; uint8_t u8; int16_t i16; uint16_t u16; int32_t i32;
  uint32_t u32; int64_t i64; uint64_t u64; float f; double d; void *p;
} cval;

/* The return buffer: ffi_call writes integers narrower than a register
** as a whole ffi_arg. */
typedef union rval {
  ffi_arg a; ffi_sarg s; int64_t i64; uint64_t u64; float f; double d;
  void *p;
} rval;

/* The arguments of one call, as converted on the Lua thread. */
typedef struct margs {
  int n;
  ffi_type *types[LFFI_MAXARGS];    /* every argument's type (variadic too) */
  cval vals[LFFI_MAXARGS];
  ums_buf_t *bufs[LFFI_MAXARGS];    /* the buffer behind argument i, or NULL */
  const char *strs[LFFI_MAXARGS];   /* a string argument i (in the Lua
                                       state), or a struct argument's
                                       bytes (in a cdata) */
  size_t slens[LFFI_MAXARGS];
} margs;

/* Converts the Lua arguments at first.. for a call of f into a; raises
** (naming the argument and f) when one does not fit its parameter. A
** call that will run on a pool thread (pool) refuses callbacks; for
** another a Lua function for a function pointer becomes a callback left
** on the stack. String
** arguments point into the Lua state, buffers are not retained: a request
** that outlives the caller's frame copies and retains them (lccall.c). */
LUMS_HIDDEN void lffi_marshal(lua_State *L, const fdecl *f, int first,
                              margs *a, bool pool);

/* Pushes f's result r (not a struct: the caller pushes a cdata); a void
** result pushes true when void_true (a timed
** call, whose nil means a timeout), nothing otherwise. Returns the number
** of values pushed. */
LUMS_HIDDEN int lffi_push_result(lua_State *L, const fdecl *f,
                                 const rval *r, bool void_true);

#endif
