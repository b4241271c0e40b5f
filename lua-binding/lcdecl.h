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
  K_CSTR,  /* const char *: string in, string out */
  K_STRUCT /* a struct by value: the declaration's ctype says which */
};

/* The C name of each kind, for messages. */
LUMS_HIDDEN extern const char *const lffi_kind_names[];

/* The values an integer kind holds, as Lua integers (K_U64 up to
** INT64_MAX: Lua has no larger integer). Marshalling (lcconv.c) and
** cdata stores (lcdata.c) check against it. */
static inline void lffi_kind_range(int k, int64_t *lo, int64_t *hi) {
  switch (k) {
    case K_I8: *lo = INT8_MIN; *hi = INT8_MAX; break;
    case K_U8: *lo = 0; *hi = UINT8_MAX; break;
    case K_I16: *lo = INT16_MIN; *hi = INT16_MAX; break;
    case K_U16: *lo = 0; *hi = UINT16_MAX; break;
    case K_I32: *lo = INT32_MIN; *hi = INT32_MAX; break;
    case K_U32: *lo = 0; *hi = UINT32_MAX; break;
    case K_I64: *lo = INT64_MIN; *hi = INT64_MAX; break;
    default: *lo = 0; *hi = INT64_MAX; break; /* K_U64 */
  }
}

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

typedef struct ctype ctype;

/* A parsed function declaration. Plain data: a bound function copies it.
** The ctypes of struct arguments and results belong to the VM: only its
** Lua thread reads them (pool threads use the bound function's own
** ffi_type copies, lccall.h). */
typedef struct fdecl {
  char name[LFFI_NAME_MAX + 1];
  char sym[LFFI_NAME_MAX + 1]; /* the symbol: name, or __asm__("sym") */
  int ret;                  /* enum kind */
  int nargs;                /* fixed arguments */
  int args[LFFI_MAXARGS];
  const ctype *rett;        /* K_STRUCT result: its type; NULL otherwise */
  const ctype *argt[LFFI_MAXARGS]; /* the same for each argument, and a
                                      function pointer's type (K_PTR) */
  bool variadic;
  bool inlined;             /* called directly, never preemptive */
  bool interruptible;       /* a task giving up on the call interrupts
                               its system call (UMS_PREEMPT_INTERRUPT) */
} fdecl;

/* A C type. Every ctype belongs to its VM (anchored in its registry for
** the VM's life) and is immutable once complete, except that a struct or
** union declared forward is completed in place by its definition.
** [Lua thread of the VM] */
#define LFFI_CTYPE_MT "ums.ffi.ctype"
/* A cdata's metatable (lcdata.c); a cdata userdata begins with its
** const ctype *. */
#define LFFI_CDATA_MT "ums.ffi.cdata"

enum ctag {
  CT_PRIM,   /* a value of a kind: kind */
  CT_PTR,    /* elem: the target, NULL for void */
  CT_ARRAY,  /* count elems; vla: a variable-length array type (T[?]) */
  CT_STRUCT, CT_UNION,
  CT_ENUM,   /* values of kind (int) */
  CT_FUNC    /* a function type, used behind a pointer; sig: its
                parameters when a Lua function can stand for it */
};

typedef struct cfield {
  char name[LFFI_NAME_MAX + 1];
  const ctype *type;
  size_t offset;
} cfield;

struct ctype {
  int tag;                  /* enum ctag */
  int kind;                 /* CT_PRIM, CT_ENUM: enum kind */
  bool complete;            /* its size is known */
  bool to_const;            /* CT_PTR: a pointer to const */
  bool vla;                 /* CT_ARRAY: T[?], sized by each ffi.new */
  size_t size, align;
  size_t count;             /* CT_ARRAY */
  const ctype *elem;        /* CT_PTR, CT_ARRAY */
  int nfields;              /* CT_STRUCT, CT_UNION */
  cfield *fields;           /* in declaration order, with offsets */
  const fdecl *sig;         /* CT_FUNC: its signature, or NULL when a
                               callback cannot take it (variadic, structs
                               or unions by value) */
  char name[2 * LFFI_NAME_MAX + 16]; /* for messages; may be cut short */
};

/* Parses the declarations in src and pushes a table mapping each declared
** name to its fdecl (a full userdata); inlined and interruptible mark
** every function declared (as UMS_INLINE and UMS_INTERRUPTIBLE do one).
** Raises on the first malformed declaration, naming its line. */
LUMS_HIDDEN void lffi_parse(lua_State *L, const char *src, bool inlined,
                            bool interruptible);

/* The type a type name such as "struct timespec *[2]" or "char[?]"
** denotes; raises naming argument arg when it does not parse. */
LUMS_HIDDEN const ctype *lffi_parse_type(lua_State *L, const char *src,
                                         int arg);

/* Pushes t's userdata (its ctype object, as ffi.typeof returns it). */
LUMS_HIDDEN void lffi_push_ctype(lua_State *L, const ctype *t);

/* The array type of n elements of elem. */
LUMS_HIDDEN const ctype *lffi_array_of(lua_State *L, const ctype *elem,
                                       size_t n);

/* An enum constant's value by name; false if none is declared. */
LUMS_HIDDEN bool lffi_const(lua_State *L, const char *name, lua_Integer *v);

/* The ctype argument arg names: a type name or a ctype; raises else. */
LUMS_HIDDEN const ctype *lffi_check_ctype(lua_State *L, int arg);

/* The signature of the function t points to, when t is a pointer to a
** function a Lua callback can stand for; NULL otherwise. */
static inline const fdecl *lffi_fnptr_sig(const ctype *t) {
  return t && t->tag == CT_PTR && t->elem && t->elem->tag == CT_FUNC
             ? t->elem->sig
             : NULL;
}

/* t's field by name; NULL when t is not a struct or union or lacks it. */
LUMS_HIDDEN const cfield *lffi_field(const ctype *t, const char *name);

/* Describes the struct t (complete, passable by value: see lcdecl.c) to
** libffi: returns its FFI_TYPE_STRUCT ffi_type, in one malloc'ed block
** the caller frees, or NULL when out of memory. Thread: any (t is only
** read). */
LUMS_HIDDEN ffi_type *lffi_struct_ffi(const ctype *t);

/* Creates the VM's type registry and the ctype metatable, and adds
** typeof, sizeof, alignof and offsetof to the ffi table at the top. */
LUMS_HIDDEN void lffi_open_types(lua_State *L);

#endif
