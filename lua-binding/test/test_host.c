/*
** test_host.c: the C host API of ums-lua.h (embedding). A host with Lua
** VMs on its schedulers, work submitted by name and as chunks from host
** threads and C tasks, values both ways, errors and tracebacks, waits
** with deadlines, cancellation, the setup function, stats, bad input, and
** shutdowns with work in flight. Every test ends with the host shut down
** and every runtime thread gone.
**
** Sizes: 4 host threads submit 100,000 requests between them in every
** build (about 0.4 s here, 3 s under ASan, 10 s under TSan).
*/
#define _GNU_SOURCE
#include "ums-lua.h"

#include "test-util.h"

#include <fcntl.h>
#include <lualib.h>
#include <math.h>
#include <stdatomic.h>

#define MANY_TOTAL 100000
#define MANY_THREADS 4

/* The stdlib of the source tree (require "ums" in every VM needs it). */
#define UMS_TEST_LUA_PATH \
  UMS_TEST_STDLIB "/?.lua;" UMS_TEST_STDLIB "/?/init.lua"

/* ---------------------------------------------------------------------- */
/* The host every test uses                                                */
/* ---------------------------------------------------------------------- */

static atomic_int setups;

/* Calls of hostmod.sleep that have started (host.started()). */
static atomic_int sleeps_started;

static int l_started(lua_State *L) {
  (void)L;
  atomic_fetch_add(&sleeps_started, 1);
  return 0;
}

/* host.twice(n): a C function the host registers in every VM. */
static int l_twice(lua_State *L) {
  lua_pushinteger(L, 2 * luaL_checkinteger(L, 1));
  return 1;
}

/* The module every test calls by name, defined by the setup function. */
static const char hostmod_src[] =
    "package.preload.hostmod = function()\n"
    "  local ums = require 'ums'\n"
    "  local M = {}\n"
    "  function M.add(a, b) return a + b end\n"
    "  function M.echo(...) return ... end\n"
    "  function M.fail(msg) error(msg, 1) end\n"
    "  function M.fail_table() error({code = 7}) end\n"
    "  function M.sleep(s, v) host.started(); ums.sleep(s); return v end\n"
    "  function M.spin() local n = 0; while true do n = n + 1 end end\n"
    "  function M.twice(n) return host.twice(n) end\n"
    "  function M.sched() return ums.scheduler() end\n"
    "  function M.fanout(n)\n"
    "    local ws = {}\n"
    "    for i = 1, n do ws[i] = ums.submit('hostmod.add', i, 0) end\n"
    "    local sum = 0\n"
    "    for i = 1, n do local ok, v = ws[i]:join(); sum = sum + v end\n"
    "    return sum\n"
    "  end\n"
    "  return M\n"
    "end\n";

static int setup(lua_State *L, int sched, void *arg) {
  (void)arg;
  CHECK(sched >= 0);
  atomic_fetch_add(&setups, 1);
  lua_newtable(L);
  lua_pushcfunction(L, l_twice);
  lua_setfield(L, -2, "twice");
  lua_pushcfunction(L, l_started);
  lua_setfield(L, -2, "started");
  lua_setglobal(L, "host");
  if (luaL_dostring(L, hostmod_src) != LUA_OK) return lua_error(L);
  return 0;
}

static ums_lua_host_t *host_new_preempt(int nsched, int preempt) {
  ums_lua_host_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.runtime.schedulers = nsched;
  cfg.preempt = preempt;
  cfg.path = UMS_TEST_LUA_PATH;  /* the stdlib of the source tree */
  cfg.setup = setup;
  int err = 0;
  ums_lua_host_t *h = ums_lua_host_new(&cfg, &err);
  CHECK(h != NULL);
  CHECK_RC(err, 0);
  return h;
}

static ums_lua_host_t *host_new(int nsched) {
  return host_new_preempt(nsched, 0);
}

/* Shuts h down cleanly (nothing left to cancel) and proves every thread
** of it is gone. */
static void host_end(ums_lua_host_t *h) {
  CHECK_RC(ums_lua_host_shutdown(h, UMS_FOREVER), 0);
  ums_lua_host_delete(h);
  CHECK_THREADS(tu_thread_baseline());
}

/* Submits fname(args) and waits for its outcome; the handle is returned
** for the caller to free. */
static ums_lua_req_t *call(ums_lua_host_t *h, const char *fname,
                           const ums_lua_value_t *args, int nargs,
                           const ums_lua_result_t **res) {
  ums_lua_req_t *req = NULL;
  CHECK_RC(ums_lua_submit(h, fname, args, nargs, NULL, &req), 0);
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, res), 0);
  return req;
}

static ums_lua_req_t *chunk(ums_lua_host_t *h, const char *src,
                            const ums_lua_value_t *args, int nargs,
                            const ums_lua_result_t **res) {
  ums_lua_req_t *req = NULL;
  CHECK_RC(ums_lua_submit_chunk(h, src, strlen(src), "=test", args, nargs,
                                NULL, &req),
           0);
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, res), 0);
  return req;
}

#define CHECK_CONTAINS(s, part)                                               \
  do {                                                                        \
    const char *s_ = (s);                                                     \
    if (!s_ || !strstr(s_, (part)))                                           \
      tu_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"",          \
              s_ ? s_ : "(null)", (part));                                    \
  } while (0)

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */
/* ---------------------------------------------------------------------- */

static void done_count(ums_lua_req_t *req, const ums_lua_result_t *res,
                       void *arg) {
  (void)req;
  (void)res;
  atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_bad_input(void) {
  ums_lua_host_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.runtime.schedulers = 2;
  cfg.runtime.clock = UMS_CLOCK_VIRTUAL;
  int err = 0;
  CHECK(ums_lua_host_new(&cfg, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "ums_lua_host_new: clock = "
                 "UMS_CLOCK_VIRTUAL needs schedulers = 1 (got 2)");
  /* The setting is named, with the runtime's bounds. */
  cfg.runtime.clock = UMS_CLOCK_REAL;
  cfg.runtime.schedulers = 5000;
  CHECK(ums_lua_host_new(&cfg, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "schedulers = 5000 is out of range "
                 "(0: one per CPU, or 1 to 1024)");
  CHECK_CONTAINS(ums_runtime_error(), "schedulers = 5000 is out of range");
  cfg.runtime.schedulers = 1;
  cfg.runtime.stack_size = 100;
  CHECK(ums_lua_host_new(&cfg, &err) == NULL);
  CHECK_CONTAINS(ums_lua_last_error(), "stack_size = 100 is out of range");
  cfg.runtime.stack_size = 0;
  cfg.runtime.preempt_threads = -3;
  CHECK(ums_lua_host_new(&cfg, &err) == NULL);
  CHECK_CONTAINS(ums_lua_last_error(), "preempt_threads = -3 is negative");

  /* A stack too small for Lua's nested C calls is refused, naming the
  ** minimum; the minimum itself is taken. */
  memset(&cfg, 0, sizeof cfg);
  cfg.runtime.schedulers = 1;
  cfg.runtime.stack_size = 64 * 1024;
  err = 0;
  CHECK(ums_lua_host_new(&cfg, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "stack_size = 65536 is out of range");
  CHECK_CONTAINS(ums_lua_last_error(), "524288");
  cfg.runtime.stack_size = UMS_LUA_STACK_SIZE_MIN;
  ums_lua_host_t *small = ums_lua_host_new(&cfg, &err);
  CHECK(small != NULL);
  ums_lua_host_delete(small);

  ums_lua_host_t *h = host_new(2);
  ums_lua_req_t *req = NULL;
  ums_lua_value_t one = ums_lua_integer(1);
  atomic_int n = 0;
  ums_lua_submit_opts_t cb = {UMS_ANY_SCHED, done_count, &n};

  CHECK_RC(ums_lua_submit(NULL, "hostmod.add", NULL, 0, NULL, &req),
           UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "host is NULL");
  CHECK_RC(ums_lua_submit(h, NULL, NULL, 0, NULL, &req), UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "name is NULL");
  const char *bad_names[] = {"nodot", ".fn", "mod.", ""};
  for (int i = 0; i < 4; i++) {
    CHECK_RC(ums_lua_submit(h, bad_names[i], NULL, 0, NULL, &req),
             UMS_EINVAL);
    CHECK_CONTAINS(ums_lua_last_error(), "is not \"module.function\"");
  }
  CHECK_RC(ums_lua_submit(h, "hostmod.add", NULL, -1, NULL, &req),
           UMS_EINVAL);
  CHECK_RC(ums_lua_submit(h, "hostmod.add", NULL, 1, NULL, &req),
           UMS_EINVAL);
  CHECK_RC(ums_lua_submit(h, "hostmod.add", &one, 1, NULL, NULL),
           UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "neither a callback nor a handle");
  ums_lua_submit_opts_t far = {2, NULL, NULL};
  CHECK_RC(ums_lua_submit(h, "hostmod.add", &one, 1, &far, &req),
           UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "scheduler 2 out of range");
  CHECK_RC(ums_lua_submit_chunk(h, NULL, 0, NULL, NULL, 0, NULL, &req),
           UMS_EINVAL);

  /* Bad values, with where they are. */
  ums_lua_value_t bad[2] = {ums_lua_integer(1), ums_lua_nil()};
  bad[1].type = 99;
  CHECK_RC(ums_lua_submit(h, "hostmod.add", bad, 2, &cb, NULL), UMS_EINVAL);
  CHECK_STR_EQ(ums_lua_last_error(),
               "ums_lua_submit: args[2]: unknown value type 99");
  ums_lua_value_t t = ums_lua_table();
  CHECK_RC(ums_lua_table_set(&t, ums_lua_nil(), ums_lua_integer(1)),
           UMS_EINVAL);
  CHECK_RC(ums_lua_table_set(&t, ums_lua_float(NAN), ums_lua_nil()),
           UMS_EINVAL);
  CHECK_RC(ums_lua_table_set(&one, ums_lua_integer(1), ums_lua_nil()),
           UMS_EINVAL);
  CHECK_RC(ums_lua_table_setfield(&t, "k", ums_lua_string("v")), 0);
  /* A nil key made by hand gets past table_set, not past submit. */
  CHECK_RC(ums_lua_table_set(&t, ums_lua_integer(1), ums_lua_nil()), 0);
  t.u.table.fields[1].key = ums_lua_nil();
  CHECK_RC(ums_lua_submit(h, "hostmod.echo", &t, 1, &cb, NULL), UMS_EINVAL);
  CHECK_CONTAINS(ums_lua_last_error(), "args[1]: table key is nil");
  ums_lua_value_free(&t);
  CHECK_EQ(t.type, UMS_LUA_TNIL);

  CHECK_RC(ums_lua_req_wait(NULL, 0, NULL), UMS_EINVAL);
  CHECK_RC(ums_lua_req_cancel(NULL), UMS_EINVAL);
  ums_lua_req_free(NULL);
  CHECK_RC(ums_lua_host_stats(h, NULL), UMS_EINVAL);
  CHECK_RC(ums_lua_host_shutdown(NULL, 0), UMS_EINVAL);

  /* Names the VM cannot resolve end the request with an error. */
  const ums_lua_result_t *res;
  req = call(h, "nosuch.fn", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "module 'nosuch' not found");
  ums_lua_req_free(req);
  req = call(h, "hostmod.nope", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "'hostmod.nope' is not a function (nil)");
  ums_lua_req_free(req);
  /* Bad argument types reach Lua, which says so. */
  ums_lua_value_t strs[2] = {ums_lua_string("x"), ums_lua_boolean(1)};
  req = call(h, "hostmod.add", strs, 2, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "attempt to add");
  ums_lua_req_free(req);
  ums_lua_value_free(&strs[0]);
  req = chunk(h, "return +", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "test:1:");
  ums_lua_req_free(req);

  CHECK_EQ(atomic_load(&n), 0);  /* no refused submit called back */
  CHECK_RC(ums_lua_host_shutdown(h, UMS_FOREVER), 0);
  /* After the shutdown: refused, and said so. */
  CHECK_RC(ums_lua_submit(h, "hostmod.add", &one, 1, &cb, NULL),
           UMS_ESHUTDOWN);
  CHECK_CONTAINS(ums_lua_last_error(), "shut down");
  CHECK(ums_lua_host_runtime(h) == NULL);
  CHECK_RC(ums_lua_host_shutdown(h, UMS_FOREVER), UMS_ESHUTDOWN);
  ums_lua_host_stats_t st;
  CHECK_RC(ums_lua_host_stats(h, &st), 0);
  CHECK_EQ(st.in_flight, 0);
  CHECK_EQ(st.submitted, st.ok + st.errors + st.cancelled);
  ums_lua_host_delete(h);
  CHECK_THREADS(tu_thread_baseline());
}

static void test_values(void) {
  ums_lua_host_t *h = host_new(2);
  const ums_lua_result_t *res;
  /* Every type there and back, integer and float kept apart. */
  ums_lua_value_t args[6];
  args[0] = ums_lua_nil();
  args[1] = ums_lua_boolean(1);
  args[2] = ums_lua_integer(INT64_MIN);
  args[3] = ums_lua_float(1.0);
  args[4] = ums_lua_lstring("a\0b", 3);
  args[5] = ums_lua_table();
  ums_lua_value_t inner = ums_lua_table();
  CHECK_RC(ums_lua_table_set(&inner, ums_lua_integer(1), ums_lua_float(2.5)),
           0);
  CHECK_RC(ums_lua_table_setfield(&args[5], "inner", inner), 0);
  CHECK_RC(ums_lua_table_set(&args[5], ums_lua_boolean(0),
                             ums_lua_string("no")),
           0);
  ums_lua_req_t *req = call(h, "hostmod.echo", args, 6, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_OK);
  CHECK_EQ(res->nvalues, 6);
  CHECK_EQ(res->values[0].type, UMS_LUA_TNIL);
  CHECK_EQ(res->values[1].type, UMS_LUA_TBOOLEAN);
  CHECK_EQ(res->values[1].u.boolean, 1);
  CHECK_EQ(res->values[2].type, UMS_LUA_TINTEGER);
  CHECK(res->values[2].u.integer == INT64_MIN);
  CHECK_EQ(res->values[3].type, UMS_LUA_TFLOAT);
  CHECK(res->values[3].u.number == 1.0);
  CHECK_EQ(res->values[4].type, UMS_LUA_TSTRING);
  CHECK_EQ(res->values[4].u.string.len, 3);
  CHECK(memcmp(res->values[4].u.string.ptr, "a\0b", 4) == 0);
  const ums_lua_value_t *in = ums_lua_table_getfield(&res->values[5],
                                                     "inner");
  CHECK(in && in->type == UMS_LUA_TTABLE);
  const ums_lua_value_t *x = ums_lua_table_geti(in, 1);
  CHECK(x && x->type == UMS_LUA_TFLOAT && x->u.number == 2.5);
  CHECK(ums_lua_table_getfield(&res->values[5], "missing") == NULL);
  CHECK(ums_lua_table_geti(&res->values[4], 1) == NULL);
  /* A copy outlives the request. */
  ums_lua_value_t kept;
  CHECK_RC(ums_lua_value_copy(&res->values[5], &kept), 0);
  ums_lua_req_free(req);
  for (int i = 0; i < 6; i++) ums_lua_value_free(&args[i]);
  in = ums_lua_table_getfield(&kept, "inner");
  CHECK(in && ums_lua_table_geti(in, 1)->u.number == 2.5);
  ums_lua_value_free(&kept);

  /* The VM's `ums` is this library's (a second copy would not know the
  ** running task: ums.scheduler() would be nil). */
  req = call(h, "hostmod.sched", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_OK);
  CHECK_EQ(res->values[0].type, UMS_LUA_TINTEGER);
  CHECK_EQ(res->values[0].u.integer, res->sched);
  ums_lua_req_free(req);

  /* Arguments of a chunk are its `...`. */
  ums_lua_value_t two[2] = {ums_lua_integer(20), ums_lua_integer(22)};
  req = chunk(h, "local a, b = ...; return a + b, math.type(a + b)", two, 2,
              &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_OK);
  CHECK_EQ(res->values[0].u.integer, 42);
  CHECK_STR_EQ(res->values[1].u.string.ptr, "integer");
  ums_lua_req_free(req);
  /* A table met twice arrives twice; a cycle, a function or a shared
  ** object cannot arrive at all. */
  req = chunk(h, "local t = {1}; return {t, t, {t}}", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_OK);
  const ums_lua_value_t *v3 = ums_lua_table_geti(&res->values[0], 3);
  CHECK(v3 && ums_lua_table_geti(ums_lua_table_geti(v3, 1), 1)->u.integer ==
                  1);
  CHECK(ums_lua_table_geti(ums_lua_table_geti(&res->values[0], 2), 1)
            ->u.integer == 1);
  ums_lua_req_free(req);
  req = chunk(h, "local t = {}; t.self = t; return 1, t", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "results[2]: a table that contains itself");
  ums_lua_req_free(req);
  req = chunk(h, "return {f = print}", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "cannot copy the results");
  ums_lua_req_free(req);
  req = chunk(h, "return {f = function() end}", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "results[1]: a function cannot reach the host");
  ums_lua_req_free(req);
  req = chunk(h, "return require('ums').shared.channel()", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "shared object cannot reach the host");
  ums_lua_req_free(req);
  host_end(h);
}

static void test_errors(void) {
  ums_lua_host_t *h = host_new(2);
  const ums_lua_result_t *res;
  ums_lua_value_t msg = ums_lua_string("boom");
  ums_lua_req_t *req = call(h, "hostmod.fail", &msg, 1, &res);
  ums_lua_value_free(&msg);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "boom");
  CHECK_CONTAINS(res->traceback, "stack traceback:");
  CHECK_CONTAINS(res->traceback, "in function 'hostmod.fail'");
  CHECK(res->nvalues == 0 && res->values == NULL);
  CHECK(res->sched == 0 || res->sched == 1);
  ums_lua_req_free(req);
  req = call(h, "hostmod.fail_table", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_STR_EQ(res->error, "(error object is a table value)");
  ums_lua_req_free(req);
  /* os.exit must not end the host. */
  req = chunk(h, "os.exit(3)", NULL, 0, &res);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "os.exit: not available in work run by a C host");
  ums_lua_req_free(req);
  host_end(h);
}

static void test_wait_cancel(void) {
  ums_lua_host_t *h = host_new(2);
  const ums_lua_result_t *res;
  ums_lua_value_t args[2] = {ums_lua_integer(30), ums_lua_integer(5)};
  ums_lua_req_t *req = NULL;
  int started = atomic_load(&sleeps_started);
  CHECK_RC(ums_lua_submit(h, "hostmod.sleep", args, 2, NULL, &req), 0);
  CHECK_RC(ums_lua_req_wait(req, 0, &res), UMS_ETIMEDOUT);
  CHECK_RC(ums_lua_req_wait(req, ums_deadline(tu_ms(20)), &res),
           UMS_ETIMEDOUT);
  /* Cancelled once it runs (a new VM under TSan may take longer than
  ** the 20 ms above to start it). */
  WAIT_UNTIL(atomic_load(&sleeps_started) > started, 10000);
  CHECK_RC(ums_lua_req_cancel(req), 0);
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
  CHECK_EQ(res->status, UMS_LUA_REQ_CANCELLED);
  CHECK_STR_EQ(res->error, "cancelled while it ran");
  CHECK_CONTAINS(res->traceback, "stack traceback:");
  CHECK_RC(ums_lua_req_cancel(req), UMS_ESRCH);
  ums_lua_req_free(req);
  /* A short sleep ends on its own, through the wait. */
  args[0] = ums_lua_float(0.005);
  CHECK_RC(ums_lua_submit(h, "hostmod.sleep", args, 2, NULL, &req), 0);
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
  CHECK_EQ(res->status, UMS_LUA_REQ_OK);
  CHECK_EQ(res->values[0].u.integer, 5);
  ums_lua_req_free(req);
  /* Freeing the handle first: the callback still comes. */
  atomic_int n = 0;
  ums_lua_submit_opts_t cb = {UMS_ANY_SCHED, done_count, &n};
  CHECK_RC(ums_lua_submit(h, "hostmod.sleep", args, 2, &cb, &req), 0);
  ums_lua_req_free(req);
  WAIT_UNTIL(atomic_load(&n) == 1, 10000);
  host_end(h);
}

/* With preempt, code that never waits is cancelled at its quantum
** (without it, only a call that can wait sees the cancellation). */
static void test_cancel_spin_preempt(void) {
  ums_lua_host_t *h = host_new_preempt(2, 1);
  const ums_lua_result_t *res;
  ums_lua_req_t *req = NULL;
  CHECK_RC(ums_lua_submit(h, "hostmod.spin", NULL, 0, NULL, &req), 0);
  CHECK_RC(ums_lua_req_wait(req, ums_deadline(tu_ms(30)), &res),
           UMS_ETIMEDOUT);
  CHECK_RC(ums_lua_req_cancel(req), 0);
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
  CHECK_EQ(res->status, UMS_LUA_REQ_CANCELLED);
  ums_lua_req_free(req);
  host_end(h);
}

/* The setup function runs once in every VM, before any work; a VM whose
** setup fails refuses its work with that error. */
static int setup_fails(lua_State *L, int sched, void *arg) {
  (void)L;
  (void)sched;
  (void)arg;
  return 5;
}

static void test_setup(void) {
  atomic_store(&setups, 0);
  ums_lua_host_t *h = host_new(2);
  ums_lua_host_stats_t st;
  CHECK_RC(ums_lua_host_stats(h, &st), 0);
  CHECK_EQ(st.vms, 0);  /* made on demand */
  CHECK_EQ(st.schedulers, 2);
  /* The scheduler asked for is where a request queues; an idle one may
  ** take it before it starts, so go on until both VMs are there. */
  int calls = 0;
  for (; calls < 2000 && st.vms < 2; calls++) {
    ums_lua_submit_opts_t on = {calls % 2, NULL, NULL};
    ums_lua_value_t n = ums_lua_integer(21);
    ums_lua_req_t *req = NULL;
    const ums_lua_result_t *res;
    CHECK_RC(ums_lua_submit(h, "hostmod.twice", &n, 1, &on, &req), 0);
    CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
    CHECK_EQ(res->status, UMS_LUA_REQ_OK);
    CHECK_EQ(res->values[0].u.integer, 42);
    ums_lua_req_free(req);
    CHECK_RC(ums_lua_host_stats(h, &st), 0);
  }
  CHECK_EQ(st.vms, 2);
  CHECK_EQ(atomic_load(&setups), 2);
  CHECK_EQ(st.ok, calls);
  host_end(h);

  ums_lua_host_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.runtime.schedulers = 2;
  cfg.path = UMS_TEST_LUA_PATH;
  cfg.setup = setup_fails;
  h = ums_lua_host_new(&cfg, NULL);
  CHECK(h != NULL);
  ums_lua_submit_opts_t on1 = {1, NULL, NULL};
  ums_lua_req_t *req;
  const ums_lua_result_t *res;
  CHECK_RC(ums_lua_submit_chunk(h, "return 1", 8, NULL, NULL, 0, &on1, &req),
           0);
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "the host's setup function returned 5");
  ums_lua_req_free(req);
  host_end(h);
}

/* A setup that refuses the schedulers whose bit is set in *arg; the
** others get the usual setup. */
static atomic_int refusals;

static int setup_refuses(lua_State *L, int sched, void *arg) {
  if (*(const int *)arg & (1 << sched)) {
    atomic_fetch_add(&refusals, 1);
    return luaL_error(L, "setup refuses scheduler %d", sched);
  }
  return setup(L, sched, arg);
}

static ums_lua_host_t *host_refusing(int *mask) {
  ums_lua_host_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.runtime.schedulers = 2;
  cfg.path = UMS_TEST_LUA_PATH;
  cfg.setup = setup_refuses;
  cfg.setup_arg = mask;
  ums_lua_host_t *h = ums_lua_host_new(&cfg, NULL);
  CHECK(h != NULL);
  return h;
}

/* A scheduler whose setup fails takes no work from the others, and what
** is queued for it runs elsewhere; when every setup fails, every request
** fails with the setup's error and nothing hangs. The message numbers the
** scheduler as the setup function saw it. */
static void test_setup_refuses(void) {
  enum { N = 100, ON1 = 20 };
  static ums_lua_req_t *reqs[N + ON1];
  const ums_lua_result_t *res;
  int mask = 1 << 1;
  atomic_store(&refusals, 0);
  ums_lua_host_t *h = host_refusing(&mask);
  for (int i = 0; i < N + ON1; i++) {
    ums_lua_submit_opts_t on = {i < N ? 0 : 1, NULL, NULL};
    ums_lua_value_t args[2] = {ums_lua_float(0.001), ums_lua_integer(i)};
    CHECK_RC(ums_lua_submit(h, "hostmod.sleep", args, 2, &on, &reqs[i]), 0);
  }
  for (int i = 0; i < N + ON1; i++) {
    CHECK_RC(ums_lua_req_wait(reqs[i], ums_now() + 60 * UMS_NSEC_PER_SEC,
                              &res), 0);
    if (res->status != UMS_LUA_REQ_OK)
      fprintf(stderr, "request %d: %s\n", i, res->error);
    CHECK_EQ(res->status, UMS_LUA_REQ_OK);
    CHECK_EQ(res->values[0].u.integer, i);
    CHECK_EQ(res->sched, 0);
    ums_lua_req_free(reqs[i]);
  }
  CHECK_EQ(atomic_load(&refusals), 1);
  host_end(h);

  mask = 3;
  atomic_store(&refusals, 0);
  h = host_refusing(&mask);
  for (int i = 0; i < N; i++) {
    ums_lua_submit_opts_t on = {i % 3 == 2 ? UMS_ANY_SCHED : i % 3, NULL,
                                NULL};
    CHECK_RC(ums_lua_submit_chunk(h, "return 1", 8, NULL, NULL, 0, &on,
                                  &reqs[i]), 0);
  }
  for (int i = 0; i < N; i++) {
    CHECK_RC(ums_lua_req_wait(reqs[i], ums_now() + 60 * UMS_NSEC_PER_SEC,
                              &res), 0);
    CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
    bool one_numbering =
        strstr(res->error, "cannot set up the Lua VM of scheduler 0: "
               "setup refuses scheduler 0") ||
        strstr(res->error, "cannot set up the Lua VM of scheduler 1: "
               "setup refuses scheduler 1");
    if (!one_numbering) fprintf(stderr, "request %d: %s\n", i, res->error);
    CHECK(one_numbering);
    ums_lua_req_free(reqs[i]);
  }
  /* Work submitted once every scheduler has refused fails at once. */
  CHECK_RC(ums_lua_submit_chunk(h, "return 1", 8, NULL, NULL, 0, NULL,
                                &reqs[0]), 0);
  CHECK_RC(ums_lua_req_wait(reqs[0], ums_now() + 60 * UMS_NSEC_PER_SEC,
                            &res), 0);
  CHECK_EQ(res->status, UMS_LUA_REQ_ERROR);
  CHECK_CONTAINS(res->error, "setup refuses scheduler");
  ums_lua_req_free(reqs[0]);
  CHECK_EQ(atomic_load(&refusals), 2);
  host_end(h);
}

/* A C task on the host's runtime: sleeps, a preemptive call, file I/O and
** Lua work, all parking only the task. */
typedef struct ctask_arg {
  ums_lua_host_t *h;
  char path[64];
  int64_t lua_result;
} ctask_arg;

static void blocking_call(void *arg) {
  usleep(2000);
  *(int *)arg = 7;
}

static void *ctask(void *p) {
  ctask_arg *a = p;
  CHECK_RC(ums_sleep(tu_ms(2)), 0);
  int got = 0;
  CHECK_RC(ums_preempt(blocking_call, &got, NULL, UMS_FOREVER), 0);
  CHECK_EQ(got, 7);
  int fd = ums_fs_open(a->path, O_CREAT | O_RDWR | O_TRUNC, 0600,
                       UMS_FOREVER);
  CHECK_GE(fd, 0);
  ums_buf_t *b = ums_buf_new(16);
  memcpy(ums_buf_data(b), "hello", 5);
  CHECK_EQ(ums_fs_write(fd, b, 0, 5, 0, UMS_FOREVER), 5);
  memset(ums_buf_data(b), 0, 16);
  CHECK_EQ(ums_fs_read(fd, b, 0, 16, 0, UMS_FOREVER), 5);
  CHECK(memcmp(ums_buf_data(b), "hello", 5) == 0);
  ums_buf_release(b);
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  CHECK_RC(ums_fs_unlink(a->path, UMS_FOREVER), 0);
  /* Lua work from a task; the wait parks only this task. */
  ums_lua_value_t n = ums_lua_integer(10);
  ums_lua_req_t *req;
  const ums_lua_result_t *res;
  CHECK_RC(ums_lua_submit(a->h, "hostmod.fanout", &n, 1, NULL, &req), 0);
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
  CHECK_EQ(res->status, UMS_LUA_REQ_OK);
  a->lua_result = res->values[0].u.integer;
  ums_lua_req_free(req);
  /* Shutting down from a task of the host would wait for itself. */
  CHECK_RC(ums_lua_host_shutdown(a->h, 0), UMS_EDEADLK);
  return NULL;
}

static void test_c_tasks(void) {
  ums_lua_host_t *h = host_new(2);
  ums_runtime_t *rt = ums_lua_host_runtime(h);
  CHECK(rt != NULL);
  ctask_arg a = {h, "", 0};
  snprintf(a.path, sizeof a.path, "/tmp/ums-test-host-%d", (int)getpid());
  ums_task_t t;
  CHECK_RC(ums_task_spawn(rt, NULL, ctask, &a, &t), 0);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), 0);
  CHECK_EQ(a.lua_result, 55);
  /* The stats surface of the same runtime. */
  ums_sched_stats_t rows[4];
  CHECK_EQ(ums_runtime_stats(rt, rows, 4), 2);
  CHECK_GE(rows[0].tasks_spawned + rows[1].tasks_spawned, 12);
  CHECK_GE(rows[0].preempt_calls + rows[1].preempt_calls, 1);
  ums_lua_host_stats_t st;
  CHECK_RC(ums_lua_host_stats(h, &st), 0);
  CHECK_EQ(st.submitted, 1);
  CHECK_EQ(st.ok, 1);
  host_end(h);
}

/* 4 host threads submit MANY_TOTAL requests between them; every result
** arrives exactly once, with the right value. */
typedef struct many {
  ums_lua_host_t *h;
  int first, n;
  _Atomic int *seen;       /* per request: callbacks */
  _Atomic int *bad;        /* wrong results */
} many;

typedef struct many_req {
  many *m;
  int i;
} many_req;

static void many_done(ums_lua_req_t *req, const ums_lua_result_t *res,
                      void *arg) {
  (void)req;
  many_req *r = arg;
  if (res->status != UMS_LUA_REQ_OK || res->nvalues != 1 ||
      res->values[0].type != UMS_LUA_TINTEGER ||
      res->values[0].u.integer != r->i + 1)
    atomic_fetch_add(r->m->bad, 1);
  atomic_fetch_add(&r->m->seen[r->i], 1);
}

static void *many_thread(void *p) {
  many *m = p;
  many_req *reqs = calloc((size_t)m->n, sizeof *reqs);
  CHECK(reqs != NULL);
  for (int k = 0; k < m->n; k++) {
    int i = m->first + k;
    reqs[k].m = m;
    reqs[k].i = i;
    ums_lua_value_t args[2] = {ums_lua_integer(i), ums_lua_integer(1)};
    ums_lua_submit_opts_t o = {UMS_ANY_SCHED, many_done, &reqs[k]};
    /* Every 64th through a handle as well: callback and wait together. */
    ums_lua_req_t *req = NULL;
    CHECK_RC(ums_lua_submit(m->h, "hostmod.add", args, 2, &o,
                            k % 64 == 0 ? &req : NULL),
             0);
    if (req) {
      const ums_lua_result_t *res;
      CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
      CHECK_EQ(res->values[0].u.integer, i + 1);
      /* The callback has returned once the wait does. */
      CHECK_EQ(atomic_load(&m->seen[i]), 1);
      ums_lua_req_free(req);
    }
  }
  return reqs;  /* freed by the test once every callback came */
}

static void test_many(void) {
  ums_lua_host_t *h = host_new(2);
  _Atomic int *seen = calloc(MANY_TOTAL, sizeof *seen);
  _Atomic int bad = 0;
  many m[MANY_THREADS];
  pthread_t th[MANY_THREADS];
  int per = MANY_TOTAL / MANY_THREADS;
  for (int i = 0; i < MANY_THREADS; i++) {
    m[i] = (many){h, i * per, per, seen, &bad};
    CHECK_RC(pthread_create(&th[i], NULL, many_thread, &m[i]), 0);
  }
  void *reqs[MANY_THREADS];
  for (int i = 0; i < MANY_THREADS; i++) pthread_join(th[i], &reqs[i]);
  /* A clean shutdown waits for every request still in flight. */
  CHECK_RC(ums_lua_host_shutdown(h, UMS_FOREVER), 0);
  for (int i = 0; i < MANY_TOTAL; i++)
    if (atomic_load(&seen[i]) != 1)
      tu_fail(__FILE__, __LINE__, "request %d: %d callbacks", i,
              atomic_load(&seen[i]));
  CHECK_EQ(atomic_load(&bad), 0);
  ums_lua_host_stats_t st;
  CHECK_RC(ums_lua_host_stats(h, &st), 0);
  CHECK_EQ(st.submitted, MANY_TOTAL);
  CHECK_EQ(st.ok, MANY_TOTAL);
  CHECK_EQ(st.in_flight, 0);
  printf("   %d requests from %d threads on %d VMs\n", MANY_TOTAL,
         MANY_THREADS, st.vms);
  ums_lua_host_delete(h);
  for (int i = 0; i < MANY_THREADS; i++) free(reqs[i]);
  free(seen);
  CHECK_THREADS(tu_thread_baseline());
}

/* Shutdown with requests in flight, racing with threads still submitting
** and a thread waiting on a handle: every accepted request ends exactly
** once, none is left waiting, nothing leaks (ASan) or races (TSan). */
#define RACE_SLOTS 200000

typedef struct race {
  ums_lua_host_t *h;
  int id;
  _Atomic int *seen;
  _Atomic int *accepted;
  _Atomic int *next;
  _Atomic int *cancelled;
} race;

static _Atomic int never_started;

typedef struct race_slot {
  race *r;
  int i;
  _Atomic(ums_lua_req_t *) req;  /* every 4th: a handle, for cancels */
  _Atomic int accepted;           /* the submit succeeded */
} race_slot;

static void race_done(ums_lua_req_t *req, const ums_lua_result_t *res,
                      void *arg) {
  (void)req;
  race_slot *s = arg;
  if (res->status == UMS_LUA_REQ_CANCELLED) {
    atomic_fetch_add(s->r->cancelled, 1);
    CHECK(res->error != NULL);
    if (strstr(res->error, "before it started"))
      atomic_fetch_add(&never_started, 1);
  }
  atomic_fetch_add(&s->r->seen[s->i], 1);
}

static race_slot *slots;

static void *race_thread(void *p) {
  race *r = p;
  static const char *const kinds[] = {"hostmod.sleep", "hostmod.spin",
                                      "hostmod.add"};
  for (;;) {
    int i = atomic_fetch_add(r->next, 1);
    if (i >= RACE_SLOTS) break;
    slots[i].r = r;
    slots[i].i = i;
    ums_lua_value_t args[2] = {ums_lua_float((i % 50) * 0.001),
                               ums_lua_integer(i)};
    if (i % 97 == 1) args[0] = ums_lua_integer(3600);  /* never ends */
    ums_lua_submit_opts_t o = {UMS_ANY_SCHED, race_done, &slots[i]};
    const char *fn = kinds[i % 61 == 2 ? 1 : i % 3 == 0 ? 2 : 0];
    ums_lua_req_t *req = NULL;
    int rc = ums_lua_submit(r->h, fn, args, 2, &o, i % 4 ? NULL : &req);
    if (rc == UMS_ESHUTDOWN) break;
    CHECK_RC(rc, 0);
    atomic_store(&slots[i].req, req);
    atomic_store(&slots[i].accepted, 1);
    atomic_fetch_add(r->accepted, 1);
    if (i % 8 == 0) usleep(50);
  }
  return NULL;
}

/* Cancels the requests it has handles for, until the shutdown is over. */
static _Atomic int race_over;

static void *canceller_thread(void *p) {
  (void)p;
  int cancels = 0;
  while (!atomic_load(&race_over)) {
    for (int i = 0; i < RACE_SLOTS && !atomic_load(&race_over); i += 4 * 7) {
      ums_lua_req_t *req = atomic_load(&slots[i].req);
      if (!req) continue;
      int rc = ums_lua_req_cancel(req);
      CHECK(rc == 0 || rc == UMS_ESRCH);
      cancels++;
    }
    usleep(200);
  }
  return (void *)(intptr_t)cancels;
}

static void *waiter_thread(void *p) {
  ums_lua_req_t *req = p;
  const ums_lua_result_t *res;
  CHECK_RC(ums_lua_req_wait(req, UMS_FOREVER, &res), 0);
  CHECK_EQ(res->status, UMS_LUA_REQ_CANCELLED);
  return NULL;
}

static void test_shutdown_in_flight(void) {
  for (int round = 0; round < 3; round++) {
    /* With preempt: the shutdown cancels hostmod.spin, which never
    ** calls anything that can wait. */
    ums_lua_host_t *h = host_new_preempt(2, 1);
    _Atomic int *seen = calloc(RACE_SLOTS, sizeof *seen);
    slots = calloc(RACE_SLOTS, sizeof *slots);
    _Atomic int accepted = 0, next = 0, cancelled = 0;
    race r[MANY_THREADS];
    pthread_t th[MANY_THREADS], w, canceller;
    atomic_store(&race_over, 0);
    atomic_store(&never_started, 0);
    ums_lua_value_t forever[2] = {ums_lua_integer(3600), ums_lua_nil()};
    ums_lua_req_t *long_req;
    CHECK_RC(ums_lua_submit(h, "hostmod.sleep", forever, 2, NULL, &long_req),
             0);
    CHECK_RC(pthread_create(&w, NULL, waiter_thread, long_req), 0);
    for (int i = 0; i < MANY_THREADS; i++) {
      r[i] = (race){h, i, seen, &accepted, &next, &cancelled};
      CHECK_RC(pthread_create(&th[i], NULL, race_thread, &r[i]), 0);
    }
    CHECK_RC(pthread_create(&canceller, NULL, canceller_thread, NULL), 0);
    /* The shutdown comes once request 1, which never ends, is in (a
    ** loaded machine may run the submitting threads late), and a while
    ** into the race. */
    WAIT_UNTIL(atomic_load(&slots[1].accepted), 10000);
    usleep(20000 + round * 30000);
    /* A deadline in the past, a short one, then none at all... none would
    ** hang on the never-ending sleeps: cancel at once or shortly. */
    int64_t deadline = round == 0 ? 0 : ums_deadline(tu_ms(10 * round));
    CHECK_RC(ums_lua_host_shutdown(h, deadline), UMS_ETIMEDOUT);
    for (int i = 0; i < MANY_THREADS; i++) pthread_join(th[i], NULL);
    pthread_join(w, NULL);
    atomic_store(&race_over, 1);
    pthread_join(canceller, NULL);
    ums_lua_req_free(long_req);
    int n = atomic_load(&accepted), ended = 0;
    for (int i = 0; i < RACE_SLOTS; i++) {
      int s = atomic_load(&seen[i]);
      if (s > 1) tu_fail(__FILE__, __LINE__, "request %d: %d callbacks", i, s);
      ended += s;
    }
    CHECK_EQ(ended, n);
    ums_lua_host_stats_t st;
    CHECK_RC(ums_lua_host_stats(h, &st), 0);
    CHECK_EQ(st.submitted, n + 1);
    CHECK_EQ(st.in_flight, 0);
    CHECK_EQ(st.ok + st.errors + st.cancelled, n + 1);
    CHECK_EQ(st.errors, 0);
    CHECK_GE(st.cancelled, 2);  /* the long one and a never-ending one */
    CHECK_GE(atomic_load(&never_started), 1);
    printf("   round %d: %d accepted, %d cancelled by the shutdown\n", round,
           n, atomic_load(&cancelled));
    ums_lua_host_delete(h);
    /* Handles outlive their host: every one has ended, and says so. */
    for (int i = 0; i < RACE_SLOTS; i += 4) {
      ums_lua_req_t *req = atomic_load(&slots[i].req);
      if (!req) continue;
      const ums_lua_result_t *res;
      CHECK_RC(ums_lua_req_wait(req, 0, &res), 0);
      CHECK_RC(ums_lua_req_cancel(req), UMS_ESRCH);
      ums_lua_req_free(req);
    }
    free(seen);
    free(slots);
    CHECK_THREADS(tu_thread_baseline());
  }
}

/* A host's own Lua state gets this library's ums through the preload. */
static void test_preload(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  ums_lua_preload(L);
  lua_getglobal(L, "package");
  lua_pushstring(L, UMS_TEST_LUA_PATH);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
  CHECK(luaL_dostring(L, "local core = require 'ums.core'\n"
                         "return core.run(function() return 6 * 7 end)") ==
        LUA_OK);
  CHECK_EQ(lua_tointeger(L, -1), 42);
  lua_close(L);
}

int main(void) {
  tu_thread_baseline();
  RUN(test_bad_input);
  RUN(test_values);
  RUN(test_errors);
  RUN(test_wait_cancel);
  RUN(test_cancel_spin_preempt);
  RUN(test_setup);
  RUN(test_setup_refuses);
  RUN(test_c_tasks);
  RUN(test_many);
  RUN(test_shutdown_in_flight);
  RUN(test_preload);
  printf("test_host: all passed\n");
  return 0;
}
