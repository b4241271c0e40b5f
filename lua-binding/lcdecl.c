/*
** lcdecl.c: ums.ffi's declaration parser, a small C parser for the
** function prototypes ffi.cdef accepts (with the typedef names of
** <stdint.h> and <sys/types.h> it knows), and the table of kinds.
**
** Threads: the Lua thread of the cdef's caller only.
*/
#define _GNU_SOURCE
#include "lcdecl.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

const char *const lffi_kind_names[] = {
    "void", "bool", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t",
    "uint32_t", "int64_t", "uint64_t", "float", "double", "pointer",
    "const pointer", "const char *"};

/* The integer kind of a C type of `size` bytes. */
static int int_kind(size_t size, bool is_unsigned) {
  switch (size) {
    case 1: return is_unsigned ? K_U8 : K_I8;
    case 2: return is_unsigned ? K_U16 : K_I16;
    case 4: return is_unsigned ? K_U32 : K_I32;
    default: return is_unsigned ? K_U64 : K_I64;
  }
}

typedef struct lexer {
  lua_State *L;
  const char *src, *p;
  char tok[LFFI_NAME_MAX + 1];  /* identifier, string literal's contents,
                                  or punctuation: "(", "..." */
  bool ident;
  bool str;                    /* tok is a string literal's contents */
  bool eof;
} lexer;

static int parse_error(lexer *x, const char *what) {
  int line = 1;
  for (const char *q = x->src; q < x->p; q++) line += *q == '\n';
  return luaL_error(x->L, "ums.ffi.cdef: line %d: %s near '%s'", line, what,
                    x->eof ? "<eof>" : x->tok);
}

static void skip_space(lexer *x) {
  for (;;) {
    while (isspace((unsigned char)*x->p)) x->p++;
    if (x->p[0] == '/' && x->p[1] == '/') {
      while (*x->p && *x->p != '\n') x->p++;
    } else if (x->p[0] == '/' && x->p[1] == '*') {
      const char *end = strstr(x->p + 2, "*/");
      x->p = end ? end + 2 : x->p + strlen(x->p);
    } else {
      return;
    }
  }
}

static void next(lexer *x) {
  skip_space(x);
  x->ident = false;
  x->str = false;
  x->eof = false;
  const char *p = x->p;
  if (*p == '"') {
    size_t n = strcspn(p + 1, "\"\n");
    if (p[1 + n] != '"' || n > LFFI_NAME_MAX) {
      snprintf(x->tok, sizeof x->tok, "%.20s", p);
      parse_error(x, "bad string literal");
    }
    memcpy(x->tok, p + 1, n);
    x->tok[n] = 0;
    x->str = true;
    x->p = p + n + 2;
    return;
  }
  if (!*p) {
    x->eof = true;
    x->tok[0] = 0;
    return;
  }
  if (isalpha((unsigned char)*p) || *p == '_') {
    size_t n = 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_') n++;
    if (n > LFFI_NAME_MAX) {
      snprintf(x->tok, sizeof x->tok, "%.20s...", p);
      parse_error(x, "name too long");
    }
    memcpy(x->tok, p, n);
    x->tok[n] = 0;
    x->ident = true;
    x->p = p + n;
    return;
  }
  if (p[0] == '.' && p[1] == '.' && p[2] == '.') {
    strcpy(x->tok, "...");
    x->p = p + 3;
    return;
  }
  x->tok[0] = *p;
  x->tok[1] = 0;
  x->p = p + 1;
}

static bool is(lexer *x, const char *s) { return strcmp(x->tok, s) == 0; }

static void expect(lexer *x, const char *s) {
  if (!is(x, s)) {
    char what[32];
    snprintf(what, sizeof what, "'%s' expected", s);
    parse_error(x, what);
  }
  next(x);
}

/* Skips __attribute__((...)). */
static bool skip_attribute(lexer *x) {
  if (!x->ident || !is(x, "__attribute__")) return false;
  next(x);
  if (!is(x, "(")) parse_error(x, "'(' expected");
  int depth = 0;
  do {
    if (x->eof) parse_error(x, "unbalanced parentheses");
    if (is(x, "(")) depth++;
    if (is(x, ")")) depth--;
    next(x);
  } while (depth > 0);
  return true;
}

/* Typedef names the parser knows, with their kinds. */
static int typedef_kind(const char *s) {
  static const struct { const char *name; int kind; } t[] = {
      {"int8_t", K_I8},     {"uint8_t", K_U8},     {"int16_t", K_I16},
      {"uint16_t", K_U16},  {"int32_t", K_I32},    {"uint32_t", K_U32},
      {"int64_t", K_I64},   {"uint64_t", K_U64},   {"bool", K_BOOL},
      {"_Bool", K_BOOL},    {NULL, 0}};
  for (int i = 0; t[i].name; i++)
    if (strcmp(s, t[i].name) == 0) return t[i].kind;
  if (strcmp(s, "size_t") == 0) return int_kind(sizeof(size_t), true);
  if (strcmp(s, "ssize_t") == 0) return int_kind(sizeof(ssize_t), false);
  if (strcmp(s, "intptr_t") == 0) return int_kind(sizeof(intptr_t), false);
  if (strcmp(s, "uintptr_t") == 0) return int_kind(sizeof(uintptr_t), true);
  if (strcmp(s, "ptrdiff_t") == 0) return int_kind(sizeof(ptrdiff_t), false);
  if (strcmp(s, "off_t") == 0) return int_kind(sizeof(off_t), false);
  if (strcmp(s, "time_t") == 0) return int_kind(sizeof(time_t), false);
  if (strcmp(s, "pid_t") == 0) return int_kind(sizeof(pid_t), false);
  if (strcmp(s, "uid_t") == 0) return int_kind(sizeof(uid_t), true);
  if (strcmp(s, "gid_t") == 0) return int_kind(sizeof(gid_t), true);
  if (strcmp(s, "mode_t") == 0) return int_kind(sizeof(mode_t), true);
  return -1;
}

/* type := {qualifier | specifier}+ {'*' {qualifier}}
** Returns the kind; *named says whether a typedef name or 'void'/'char'...
** was seen (a type is required). */
static int parse_type(lexer *x) {
  int n_signed = 0, n_unsigned = 0, n_char = 0, n_short = 0, n_int = 0,
      n_long = 0, n_float = 0, n_double = 0, n_void = 0, tdef = -1;
  bool is_const = false, any = false, spec = false;
  for (;;) {
    if (!x->ident) break;
    if (skip_attribute(x)) continue;
    if (is(x, "const")) {
      is_const = true;
      any = true;
      next(x);
      continue;
    }
    else if (is(x, "volatile")) {
      any = true;
      next(x);
      continue;
    }
    else if (is(x, "struct") || is(x, "enum") || is(x, "union"))
      parse_error(x, "struct, union and enum types are not supported (use "
                     "a pointer type such as void *)");
    else if (is(x, "signed")) n_signed++;
    else if (is(x, "unsigned")) n_unsigned++;
    else if (is(x, "char")) n_char++;
    else if (is(x, "short")) n_short++;
    else if (is(x, "int")) n_int++;
    else if (is(x, "long")) n_long++;
    else if (is(x, "float")) n_float++;
    else if (is(x, "double")) n_double++;
    else if (is(x, "void")) n_void++;
    else if (!spec && typedef_kind(x->tok) >= 0)
      tdef = typedef_kind(x->tok);
    else
      break; /* the declarator's name */
    any = spec = true;
    next(x);
  }
  if (!any) parse_error(x, "type expected");
  int base;
  int nspec = n_char + n_short + n_int + n_float + n_double + n_void +
              (tdef >= 0) + (n_long > 0);
  if (n_signed + n_unsigned > 1 || n_char > 1 || n_short > 1 || n_int > 1 ||
      n_long > 2 || n_float > 1 || n_double > 1 || n_void > 1 ||
      (n_short && n_long) || (n_int && (n_char)))
    parse_error(x, "invalid combination of type specifiers");
  if (tdef >= 0) {
    if (nspec > 1 || n_signed || n_unsigned)
      parse_error(x, "invalid combination of type specifiers");
    base = tdef;
  } else if (n_void) {
    if (nspec > 1 || n_signed || n_unsigned)
      parse_error(x, "invalid combination of type specifiers");
    base = K_VOID;
  } else if (n_float || n_double) {
    if (n_long && n_double) parse_error(x, "long double is not supported");
    if (nspec > 1 || n_signed || n_unsigned)
      parse_error(x, "invalid combination of type specifiers");
    base = n_float ? K_FLOAT : K_DOUBLE;
  } else if (n_char) {
    if (nspec > 1) parse_error(x, "invalid combination of type specifiers");
    /* Plain char is signed on x86 and unsigned on aarch64. */
    base = int_kind(1, n_unsigned || (!n_signed && (char)-1 > 0));
  } else if (n_short) {
    base = int_kind(sizeof(short), n_unsigned);
  } else if (n_long == 1) {
    base = int_kind(sizeof(long), n_unsigned);
  } else if (n_long == 2) {
    base = int_kind(sizeof(long long), n_unsigned);
  } else if (n_int || n_signed || n_unsigned) {
    base = int_kind(sizeof(int), n_unsigned);
  } else {
    parse_error(x, "type expected");
    return K_VOID;
  }
  int depth = 0;
  while (is(x, "*")) {
    depth++;
    next(x);
    while (x->ident && (is(x, "const") || is(x, "restrict") ||
                        is(x, "__restrict") || is(x, "volatile")))
      next(x);
  }
  if (depth == 0) return base;
  if (depth == 1 && is_const && (base == K_I8 || base == K_U8)) return K_CSTR;
  if (depth == 1 && is_const) return K_CPTR;
  return K_PTR;
}

/* One declaration, up to and including its ';'. */
static void parse_decl(lexer *x, fdecl *d, bool inlined) {
  memset(d, 0, sizeof *d);
  d->inlined = inlined;
  for (;;) {
    if (x->ident && (is(x, "UMS_INLINE"))) {
      d->inlined = true;
      next(x);
    } else if (x->ident && (is(x, "extern") || is(x, "static") ||
                            is(x, "inline") || is(x, "__inline"))) {
      next(x);
    } else if (!skip_attribute(x)) {
      break;
    }
  }
  if (x->ident && is(x, "typedef"))
    parse_error(x, "typedef is not supported (declare functions only)");
  d->ret = parse_type(x);
  if (!x->ident) parse_error(x, "function name expected");
  strcpy(d->name, x->tok);
  next(x);
  if (!is(x, "("))
    parse_error(x, "'(' expected (only functions can be declared)");
  next(x);
  if (is(x, "void") && x->p[strspn(x->p, " \t\r\n")] == ')') {
    next(x); /* (void) */
  } else if (!is(x, ")")) {
    for (;;) {
      if (is(x, "...")) {
        if (d->nargs == 0)
          parse_error(x, "'...' needs a fixed argument before it");
        d->variadic = true;
        next(x);
        break;
      }
      if (d->nargs == LFFI_MAXARGS) parse_error(x, "too many arguments");
      int k = parse_type(x);
      if (k == K_VOID) parse_error(x, "argument of type void");
      if (x->ident) next(x); /* its name */
      if (is(x, "[")) {      /* T name[] or T name[N]: a pointer */
        while (!x->eof && !is(x, "]")) next(x);
        expect(x, "]");
        k = K_PTR;
      }
      d->args[d->nargs++] = k;
      if (!is(x, ",")) break;
      next(x);
    }
  }
  expect(x, ")");
  strcpy(d->sym, d->name);
  for (;;) {
    if (skip_attribute(x)) continue;
    if (x->ident && (is(x, "__asm__") || is(x, "__asm") || is(x, "asm"))) {
      /* A symbol name different from the declared one (as in LuaJIT). */
      next(x);
      expect(x, "(");
      if (!x->str || !x->tok[0]) parse_error(x, "symbol name expected");
      strcpy(d->sym, x->tok);
      next(x);
      expect(x, ")");
      continue;
    }
    break;
  }
  expect(x, ";");
}

void lffi_parse(lua_State *L, const char *src, bool inlined) {
  lexer x = {.L = L, .src = src, .p = src};
  next(&x);
  lua_newtable(L);
  int pending = lua_gettop(L);
  while (!x.eof) {
    if (is(&x, ";")) {
      next(&x);
      continue;
    }
    fdecl *d = (fdecl *)lua_newuserdatauv(L, sizeof *d, 0);
    parse_decl(&x, d, inlined);
    lua_setfield(L, pending, d->name);
  }
}
