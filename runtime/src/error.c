/*
** error.c: names and messages for UMS_E* codes.
*/
#include "ums.h"

const char *ums_strerror(int err) {
  if (err == 0) return "success";
  switch (err) {
#define UMS__ERR_TEXT(name, value, text) case UMS_##name: return text;
    UMS_ERRNO_MAP(UMS__ERR_TEXT)
#undef UMS__ERR_TEXT
  }
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
