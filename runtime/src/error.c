/*
** error.c: names and messages for UMS_E* codes.
*/
#include "ums.h"

#include <string.h>

const char *ums_strerror(int err) {
  if (err == 0) return "success";
  switch (err) {
#define UMS__ERR_TEXT(name, value, text) case UMS_##name: return text;
    UMS_ERRNO_MAP(UMS__ERR_TEXT)
#undef UMS__ERR_TEXT
  }
  /* File I/O passes the kernel's codes through; the C library knows the
  ** ones not in the map. (strerror's buffer is static only for unknown
  ** numbers, which it formats; the known texts are constants.) */
  if (err < 0 && err > -4096) return strerror(-err);
  return "unknown error";
}

const char *ums_err_name(int err) {
  if (err == 0) return "0";
  switch (err) {
#define UMS__ERR_NAME(name, value, text) case UMS_##name: return "UMS_" #name;
    UMS_ERRNO_MAP(UMS__ERR_NAME)
#undef UMS__ERR_NAME
  }
  return "UMS_E?";
}
