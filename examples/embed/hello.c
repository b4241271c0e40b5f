/* hello.c: the smallest ums host (docs/embedding.md's example). */
#include <stdio.h>
#include <string.h>

#include "ums-lua.h"

/* Runs in every new Lua VM before any work: registers the host's code. */
static int setup(lua_State *L, int sched, void *arg) {
  (void)sched;
  (void)arg;
  return luaL_dostring(L, "package.preload.greet = function() return {"
                          "  hello = function(who, n) return 'hello, ' .."
                          "    who, n * 2 end} end");
}

/* Called once per request, when it ends, on a scheduler thread. */
static void done(ums_lua_req_t *req, const ums_lua_result_t *res, void *arg) {
  (void)req;
  (void)arg;
  if (res->status == UMS_LUA_REQ_ERROR) /* the traceback starts with it */
    printf("error: %s\n", res->traceback);
}

int main(void) {
  ums_lua_host_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.runtime.schedulers = 2;
  cfg.setup = setup;
  int err;
  ums_lua_host_t *h = ums_lua_host_new(&cfg, &err);
  if (!h) return fprintf(stderr, "%s\n", ums_lua_last_error()), 1;

  /* By name, waiting on the handle with a deadline. */
  ums_lua_value_t args[2] = {ums_lua_string("world"), ums_lua_integer(21)};
  ums_lua_req_t *req;
  const ums_lua_result_t *res;
  if (ums_lua_submit(h, "greet.hello", args, 2, NULL, &req) == 0) {
    if (ums_lua_req_wait(req, ums_deadline(UMS_NSEC_PER_SEC), &res) == 0 &&
        res->status == UMS_LUA_REQ_OK)
      printf("%s %lld\n", res->values[0].u.string.ptr,
             (long long)res->values[1].u.integer);
    ums_lua_req_free(req);
  }
  ums_lua_value_free(&args[0]);

  /* A chunk whose error comes back through the callback. */
  ums_lua_submit_opts_t opts = {UMS_ANY_SCHED, done, NULL};
  const char *src = "error('no such thing')";
  ums_lua_submit_chunk(h, src, strlen(src), "=chunk", NULL, 0, &opts, NULL);

  ums_lua_host_delete(h); /* waits for the work, frees everything */
  return 0;
}
