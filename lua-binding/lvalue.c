/*
** lvalue.c: the values a C host exchanges with Lua (ums_lua_value_t,
** ums-lua.h): strings and tables in C memory, owned by whoever holds the
** value. lcopy.c turns them into messages and back; nothing here knows a
** Lua state.
*/
#include "lcopy.h"

#include <stdlib.h>
#include <string.h>

ums_lua_value_t ums_lua_lstring(const char *s, size_t len) {
  ums_lua_value_t v = ums_lua_nil();
  char *p = s ? malloc(len + 1) : NULL;
  if (!p) return v;
  memcpy(p, s, len);
  p[len] = '\0';
  v.type = UMS_LUA_TSTRING;
  v.u.string.ptr = p;
  v.u.string.len = len;
  return v;
}

ums_lua_value_t ums_lua_string(const char *s) {
  return ums_lua_lstring(s, s ? strlen(s) : 0);
}

void ums_lua_value_free(ums_lua_value_t *v) {
  if (!v) return;
  if (v->type == UMS_LUA_TSTRING) {
    free(v->u.string.ptr);
  } else if (v->type == UMS_LUA_TTABLE) {
    for (size_t i = 0; i < v->u.table.n; i++) {
      ums_lua_value_free(&v->u.table.fields[i].key);
      ums_lua_value_free(&v->u.table.fields[i].value);
    }
    free(v->u.table.fields);
  }
  *v = ums_lua_nil();
}

int ums_lua_table_set(ums_lua_value_t *t, ums_lua_value_t key,
                      ums_lua_value_t value) {
  int rc = 0;
  if (!t || t->type != UMS_LUA_TTABLE || key.type == UMS_LUA_TNIL ||
      (key.type == UMS_LUA_TFLOAT && key.u.number != key.u.number)) {
    rc = UMS_EINVAL;
  } else if (t->u.table.n == t->u.table.cap) {
    size_t cap = t->u.table.cap ? t->u.table.cap * 2 : 4;
    ums_lua_field_t *f = realloc(t->u.table.fields, cap * sizeof *f);
    if (f) {
      t->u.table.fields = f;
      t->u.table.cap = cap;
    } else {
      rc = UMS_ENOMEM;
    }
  }
  if (rc) {
    /* key and value were handed over: they go, also on failure. */
    ums_lua_value_free(&key);
    ums_lua_value_free(&value);
    return rc;
  }
  ums_lua_field_t *f = &t->u.table.fields[t->u.table.n++];
  f->key = key;
  f->value = value;
  return 0;
}

int ums_lua_table_setfield(ums_lua_value_t *t, const char *key,
                           ums_lua_value_t value) {
  if (!key) {
    ums_lua_value_free(&value);
    return UMS_EINVAL;
  }
  ums_lua_value_t k = ums_lua_string(key);
  if (k.type != UMS_LUA_TSTRING) {
    ums_lua_value_free(&value);
    return UMS_ENOMEM;
  }
  return ums_lua_table_set(t, k, value);
}

/* The last field whose key is k (Lua sees the last one set). */
static const ums_lua_value_t *find(const ums_lua_value_t *t,
                                   const ums_lua_value_t *k) {
  if (!t || t->type != UMS_LUA_TTABLE) return NULL;
  for (size_t i = t->u.table.n; i-- > 0;) {
    const ums_lua_value_t *key = &t->u.table.fields[i].key;
    if (key->type != k->type) continue;
    if (k->type == UMS_LUA_TINTEGER ? key->u.integer == k->u.integer
        : k->type == UMS_LUA_TSTRING
            ? key->u.string.len == k->u.string.len &&
                  memcmp(key->u.string.ptr, k->u.string.ptr,
                         k->u.string.len) == 0
            : false)
      return &t->u.table.fields[i].value;
  }
  return NULL;
}

const ums_lua_value_t *ums_lua_table_getfield(const ums_lua_value_t *t,
                                              const char *key) {
  if (!key) return NULL;
  ums_lua_value_t k = ums_lua_nil();
  k.type = UMS_LUA_TSTRING;
  k.u.string.ptr = (char *)key;  /* only read */
  k.u.string.len = strlen(key);
  return find(t, &k);
}

const ums_lua_value_t *ums_lua_table_geti(const ums_lua_value_t *t,
                                          int64_t i) {
  ums_lua_value_t k = ums_lua_integer(i);
  return find(t, &k);
}

int ums_lua_value_copy(const ums_lua_value_t *v, ums_lua_value_t *out) {
  *out = ums_lua_nil();
  if (!v) return 0;
  switch (v->type) {
    case UMS_LUA_TSTRING:
      *out = ums_lua_lstring(v->u.string.ptr ? v->u.string.ptr : "",
                             v->u.string.len);
      return out->type == UMS_LUA_TSTRING ? 0 : UMS_ENOMEM;
    case UMS_LUA_TTABLE:
      *out = ums_lua_table();
      for (size_t i = 0; i < v->u.table.n; i++) {
        ums_lua_value_t k, val;
        int rc = ums_lua_value_copy(&v->u.table.fields[i].key, &k);
        if (rc == 0) rc = ums_lua_value_copy(&v->u.table.fields[i].value,
                                             &val);
        else val = ums_lua_nil();
        if (rc == 0) rc = ums_lua_table_set(out, k, val);
        else ums_lua_value_free(&k);
        if (rc) {
          ums_lua_value_free(out);
          return rc;
        }
      }
      return 0;
    default:
      *out = *v;
      return 0;
  }
}
