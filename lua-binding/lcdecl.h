/*
** lcdecl.h: ums.ffi's C types and the declaration parser (lcdecl.c).
** A declaration is parsed on the Lua thread into plain data (fdecl) that a
** bound function copies and pool threads then only read.
*/
#ifndef LCDECL_H
#define LCDECL_H

#include <ffi.h>
#include <stdbool.h>
#include <stddef.h>

#include "lums.h"

/* Most arguments of one call, variadic ones included. */
#define LFFI_MAXARGS 32
#define LFFI_NAME_MAX 63

enum kind {
  K_VOID, K_BOOL, K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64,
  K_FLOAT, K_DOUBLE,
  K_PTR,   /* a pointer: buffer, pointer or nil in; a pointer out */
  K_CPTR,  /* a pointer to const: a string too */
  K_CSTR   /* const char *: string in, string out */
};

/* The C name of each kind, for messages. */
LUMS_HIDDEN extern const char *const lffi_kind_names[];

static inline ffi_type *lffi_kind_ffi(int k) {
  switch (k) {
    case K_VOID: return &ffi_type_void;
    case K_BOOL: return &ffi_type_uint8;
    case K_I8: return &ffi_type_sint8;
    case K_U8: return &ffi_type_uint8;
    case K_I16: return &ffi_type_sint16;
    case K_U16: return &ffi_type_uint16;
    case K_I32: return &ffi_type_sint32;
    case K_U32: return &ffi_type_uint32;
    case K_I64: return &ffi_type_sint64;
    case K_U64: return &ffi_type_uint64;
    case K_FLOAT: return &ffi_type_float;
    case K_DOUBLE: return &ffi_type_double;
    default: return &ffi_type_pointer;
  }
}

/* A parsed function declaration. Plain data: a bound function copies it. */
typedef struct fdecl {
  char name[LFFI_NAME_MAX + 1];
  char sym[LFFI_NAME_MAX + 1]; /* the symbol: name, or __asm__("sym") */
  int ret;                  /* enum kind */
  int nargs;                /* fixed arguments */
  int args[LFFI_MAXARGS];
  bool variadic;
  bool inlined;             /* called directly, never preemptive */
} fdecl;

/* Parses the declarations in src and pushes a table mapping each declared
** name to its fdecl (a full userdata). Raises on the first malformed
** declaration, naming its line. */
LUMS_HIDDEN void lffi_parse(lua_State *L, const char *src, bool inlined);

#endif
