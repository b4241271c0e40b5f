/*
** lhost.c: the C host API of ums-lua.h ("Embedding"). A host owns a
** runtime whose schedulers each get a Lua VM, and submits work requests
** to them from any of its threads.
**
** No main VM. core.run's VM is scheduler 0's and its thread is blocked in
** core.run for the whole run; a host has no such thread (it submits from
** any thread, and may have none waiting), so here every VM, scheduler 0's
** included, is made by lvm.c on its own scheduler's thread, and the host
** never holds a Lua state. A hidden main VM would cost a VM that runs
** nothing the host asked for and would tie scheduler 0 to a thread that
** does not exist; what the main VM does for a Lua run is done here
** without one: the settings every VM gets (paths, init module, the
** host's setup function) are plain C strings and pointers in lrun, the
** quantum's looks are owned by the host (lums_monitor_new), and the
** outcome of each request goes to the host through lreq.on_finish
** instead of to a main VM's on_error.
**
** A request is an lreq (ldisp.c makes it a work item of the runtime, lreq.c
** runs it, exactly as they do ums.submit's) inside a struct ums_lua_req
** that adds what the host sees: its callback, its outcome as C values,
** and an event that waiters (host threads or C tasks) wait on.
**
** Shutdown and calls in flight. The host struct outlives its runtime.
** Calls that touch the runtime or the VMs' queues (submits, cancels,
** stats) count themselves in `calls` while inside. A shutdown turns the
** state to CLOSING (submits are refused, cancels still work while the
** work in flight may finish) and waits until the calls inside have left,
** so that no request is half queued; after the grace period it turns it
** to TEARDOWN (cancels are refused too: the shutdown cancels everything
** itself) and waits for the calls inside again; only then does it shut
** the runtime down and close the VMs, with nobody else in them. Every
** request has ended when it returns (the runtime's shutdown ends the
** running ones, lums_run_close the rest), so no callback can run after
** it.
*/
#define _GNU_SOURCE /* strdup */
#include "lvm.h"

#include <lualib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lua's C calls need a deeper C stack than ums's default (see lums.c). */
#define HOST_STACK_SIZE (1024 * 1024)
#define HOST_QUANTUM_NS (4 * UMS_NSEC_PER_MSEC)

enum { H_RUNNING, H_CLOSING, H_TEARDOWN, H_CLOSED };

struct ums_lua_host {
  ums_runtime_t *rt;     /* [lock: the pointer; owned, shut down and freed
                            by the shutdown] */
  lrun *run;             /* [owned; closed by the shutdown] */
  lmonitor *monitor;     /* [owned; the quantum monitor, freed by the
                            shutdown] */
  int nsched;            /* [const] */
  pthread_mutex_t lock;  /* guards state and calls */
  pthread_cond_t cond;   /* calls reached 0; state reached H_CLOSED */
  int state;             /* [lock] H_* */
  int calls;             /* [lock] calls inside (submit, cancel, stats) */
  int vms_made;          /* [lock] VMs made, counted at the shutdown */
  _Atomic uint64_t submitted, ok, errors, cancelled;  /* [atomic] */
};

/* A host's work request. The lreq comes first: lreq.c and ldisp.c see
** only that. The references: the maker's (which becomes the host's
** handle, or is dropped at once when the host asked for none) and the
** run's while the request is not done (lreq.c). */
struct ums_lua_req {
  lreq r;
  ums_lua_host_t *host;  /* [const] outlives the request's end */
  ums_lua_done_fn done;  /* [const] */
  void *done_arg;        /* [const] */
  ums_event_t *ended;    /* [owned; deleted with the request] set once res
                            is final and the callback has returned */
  /* Written once by host_finish, before `ended` is set; read-only after
  ** (readers see it through the event, or in the callback). */
  ums_lua_result_t res;
  ums_lua_value_t *values;  /* [owned] res.values */
  char *error;              /* [owned] res.error when made here */
};

/* ---------------------------------------------------------------------- */
/* Errors in words                                                         */
/* ---------------------------------------------------------------------- */

static _Thread_local char last_error[384];

const char *ums_lua_last_error(void) { return last_error; }

/* Records why the current call fails and returns rc. */
static int fail(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return rc;
}

/* The same for a call that returns a pointer: records why, returns NULL. */
#define NULL_FAIL(rc, ...) (fail((rc), __VA_ARGS__), NULL)

/* ---------------------------------------------------------------------- */
/* The module, for the host's own Lua states                               */
/* ---------------------------------------------------------------------- */

int ums_lua_open(lua_State *L) { return lums_open(L); }

void ums_lua_preload(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, ums_lua_open);
  lua_setfield(L, -2, "ums.core");
  lua_pop(L, 1);
}

/* ---------------------------------------------------------------------- */
/* Requests                                                                */
/* ---------------------------------------------------------------------- */

static void req_destroy(lshared *o) {
  struct ums_lua_req *q = (struct ums_lua_req *)o;
  lums_req_clear(&q->r);
  for (int i = 0; q->values && i < q->res.nvalues; i++)
    ums_lua_value_free(&q->values[i]);
  free(q->values);
  free(q->error);
  if (q->ended) ums_event_delete(q->ended);
  free(q);
}

static const lshared_kind host_kind = {"ums.host.work", req_destroy, NULL};

/* The error value of a failed request, as text. */
static char *error_text(const lmsg *m) {
  char err[256];
  ums_lua_value_t *v = NULL;
  char buf[64];
  const char *s = "(no error value)";
  if (m && lcopy_to_values(m, &v, "error", err, sizeof err) == 0 && v &&
      m->nvalues > 0) {
    switch (v[0].type) {
      case UMS_LUA_TSTRING:
        s = v[0].u.string.ptr;
        break;
      case UMS_LUA_TINTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)v[0].u.integer);
        s = buf;
        break;
      case UMS_LUA_TFLOAT:
        snprintf(buf, sizeof buf, "%.14g", v[0].u.number);
        s = buf;
        break;
      case UMS_LUA_TTABLE:
        s = "(error object is a table value)";
        break;
      case UMS_LUA_TBOOLEAN:
        s = v[0].u.boolean ? "true" : "false";
        break;
      default:
        s = "nil";
        break;
    }
  } else if (m) {
    s = "(error object cannot reach the host)";
  }
  char *out = strdup(s);
  if (v) {
    for (int i = 0; i < m->nvalues; i++) ums_lua_value_free(&v[i]);
    free(v);
  }
  return out;
}

/* lreq.on_finish: the outcome into C values, the counters, the callback,
** then the event. On the thread that ended the request; r's fields are
** final (R_DONE) and the run still holds r. */
static void host_finish(lreq *r) {
  struct ums_lua_req *q = (struct ums_lua_req *)r;
  ums_lua_host_t *h = q->host;
  ums_lua_result_t *res = &q->res;
  char err[320];
  res->sched = r->sched;
  res->values = NULL;
  res->nvalues = 0;
  res->error = res->traceback = NULL;
  switch (r->outcome) {
    case O_OK:
      if (!r->results ||
          lcopy_to_values(r->results, &q->values, "results", err,
                          sizeof err) == 0) {
        res->status = UMS_LUA_REQ_OK;
        res->values = q->values;
        res->nvalues = r->results ? r->results->nvalues : 0;
        break;
      }
      /* Results the host cannot take: an error of the request. */
      res->status = UMS_LUA_REQ_ERROR;
      {
        char msg[400];
        snprintf(msg, sizeof msg, "ums_lua: cannot pass the results to the "
                 "host: %s", err);
        q->error = strdup(msg);
      }
      res->error = q->error ? q->error : "ums_lua: cannot pass the results";
      res->traceback = "";
      break;
    case O_ERROR:
      res->status = UMS_LUA_REQ_ERROR;
      q->error = error_text(r->results);
      res->error = q->error ? q->error : "(out of memory)";
      res->traceback = r->traceback ? r->traceback : "";
      break;
    default:
      res->status = UMS_LUA_REQ_CANCELLED;
      /* Never run (no task id: it did not reach R_RUNNING): ldisp.c says
      ** why in the traceback's place. Ran: that is the traceback where
      ** the cancellation hit. */
      if (r->task == 0 && r->traceback) {
        res->error = r->traceback;
      } else {
        res->error = "cancelled while it ran";
        res->traceback = r->traceback;
      }
      break;
  }
  atomic_fetch_add(res->status == UMS_LUA_REQ_OK      ? &h->ok
                   : res->status == UMS_LUA_REQ_ERROR ? &h->errors
                                                      : &h->cancelled,
                   1);
  if (q->done) q->done(q, res, q->done_arg);
  ums_event_set(q->ended);
}

/* "module.function": a dot, with something on both sides. */
static bool good_name(const char *s) {
  const char *dot = strrchr(s, '.');
  return dot && dot != s && dot[1] != '\0';
}

/* Lets a call in: while running, or (closing) also while a shutdown
** lets the work in flight finish. */
static bool enter(ums_lua_host_t *h, bool closing) {
  pthread_mutex_lock(&h->lock);
  bool in = h->state == H_RUNNING || (closing && h->state == H_CLOSING);
  if (in) h->calls++;
  pthread_mutex_unlock(&h->lock);
  return in;
}

/* With h->lock held: moves to state and waits until no call is inside. */
static void close_to(ums_lua_host_t *h, int state) {
  h->state = state;
  while (h->calls > 0) pthread_cond_wait(&h->cond, &h->lock);
}

static void leave(ums_lua_host_t *h) {
  pthread_mutex_lock(&h->lock);
  if (--h->calls == 0 && h->state != H_RUNNING)
    pthread_cond_broadcast(&h->cond);
  pthread_mutex_unlock(&h->lock);
}

/* Makes the request (name or chunk) and queues it; inside enter/leave. */
static int submit_in(ums_lua_host_t *h, const char *fname, const char *name,
                     const char *chunk, size_t len, const char *chunkname,
                     const ums_lua_value_t *args, int nargs,
                     const ums_lua_submit_opts_t *opts,
                     ums_lua_req_t **out) {
  int sched = opts ? opts->sched : UMS_ANY_SCHED;
  if (sched != UMS_ANY_SCHED && (sched < 0 || sched >= h->nsched))
    return fail(UMS_EINVAL, "%s: scheduler %d out of range (0 to %d, or "
                "UMS_ANY_SCHED)", fname, sched, h->nsched - 1);
  if (!out && !(opts && opts->done))
    return fail(UMS_EINVAL, "%s: neither a callback nor a handle: nobody "
                "would see the outcome", fname);
  struct ums_lua_req *q = calloc(1, sizeof *q);
  if (!q) return fail(UMS_ENOMEM, "%s: out of memory", fname);
  lshared_init(&q->r.h, &host_kind);  /* the maker's reference */
  lreq *r = &q->r;
  r->rt = h->rt;
  r->run = h->run;
  r->sched = -1;
  r->state = R_QUEUED;
  r->on_finish = host_finish;
  q->host = h;
  q->done = opts ? opts->done : NULL;
  q->done_arg = opts ? opts->done_arg : NULL;
  char err[256];
  bool mem = true;
  if (name) {
    mem = (r->name = strdup(name)) != NULL;
  } else {
    r->chunk = malloc(len ? len : 1);
    r->chunkname = strdup(chunkname ? chunkname : "=(host chunk)");
    r->chunklen = len;
    mem = r->chunk && r->chunkname;
    if (r->chunk) memcpy(r->chunk, chunk, len);
  }
  q->ended = mem ? ums_event_new(1, 0) : NULL;
  if (!q->ended) {
    lshared_unref(&r->h);
    return fail(UMS_ENOMEM, "%s: out of memory", fname);
  }
  r->args = lcopy_from_values(args, nargs, "args", err, sizeof err);
  if (!r->args) {
    lshared_unref(&r->h);
    return fail(strcmp(err, "out of memory") == 0 ? UMS_ENOMEM : UMS_EINVAL,
                "%s: %s", fname, err);
  }
  if (out) lshared_ref(&r->h);  /* the handle's */
  atomic_fetch_add(&h->submitted, 1);  /* before it can end */
  /* UMS_ESHUTDOWN here would mean the runtime is shutting down with this
  ** submit inside, which the host's shutdown never lets happen; if it
  ** did, the request has ended cancelled and its callback was called,
  ** so it counts as accepted either way. */
  (void)lums_req_queue(h->run, r, sched);
  lshared_unref(&r->h);  /* the maker's: the run and the handle hold it */
  if (out) *out = q;
  return 0;
}

static int submit(ums_lua_host_t *h, const char *fname, const char *name,
                  const char *chunk, size_t len, const char *chunkname,
                  const ums_lua_value_t *args, int nargs,
                  const ums_lua_submit_opts_t *opts, ums_lua_req_t **out) {
  last_error[0] = '\0';
  if (!h) return fail(UMS_EINVAL, "%s: host is NULL", fname);
  if (name && !good_name(name))
    return fail(UMS_EINVAL, "%s: \"%s\" is not \"module.function\"", fname,
                name);
  if (nargs < 0 || (nargs > 0 && !args))
    return fail(UMS_EINVAL, "%s: %d arguments at %p", fname, nargs,
                (const void *)args);
  if (!enter(h, false))
    return fail(UMS_ESHUTDOWN, "%s: the host is shut down", fname);
  int rc = submit_in(h, fname, name, chunk, len, chunkname, args, nargs,
                     opts, out);
  leave(h);
  return rc;
}

int ums_lua_submit(ums_lua_host_t *h, const char *fname,
                   const ums_lua_value_t *args, int nargs,
                   const ums_lua_submit_opts_t *opts, ums_lua_req_t **req) {
  if (!fname) {
    last_error[0] = '\0';
    return fail(UMS_EINVAL, "ums_lua_submit: function name is NULL");
  }
  return submit(h, "ums_lua_submit", fname, NULL, 0, NULL, args, nargs, opts,
                req);
}

int ums_lua_submit_chunk(ums_lua_host_t *h, const char *source, size_t len,
                         const char *chunkname, const ums_lua_value_t *args,
                         int nargs, const ums_lua_submit_opts_t *opts,
                         ums_lua_req_t **req) {
  if (!source) {
    last_error[0] = '\0';
    return fail(UMS_EINVAL, "ums_lua_submit_chunk: source is NULL");
  }
  return submit(h, "ums_lua_submit_chunk", NULL, source, len, chunkname,
                args, nargs, opts, req);
}

int ums_lua_req_wait(ums_lua_req_t *req, int64_t deadline,
                     const ums_lua_result_t **res) {
  last_error[0] = '\0';
  if (!req) return fail(UMS_EINVAL, "ums_lua_req_wait: request is NULL");
  int rc = ums_event_is_set(req->ended) ? 0
           : deadline <= 0              ? UMS_ETIMEDOUT
                                        : ums_event_wait(req->ended, deadline);
  if (rc == 0 && res) *res = &req->res;
  return rc;
}

int ums_lua_req_cancel(ums_lua_req_t *req) {
  last_error[0] = '\0';
  if (!req) return fail(UMS_EINVAL, "ums_lua_req_cancel: request is NULL");
  pthread_mutex_lock(&req->r.h.lock);
  bool done = req->r.state == R_DONE;
  pthread_mutex_unlock(&req->r.h.lock);
  if (done) return UMS_ESRCH;
  /* Not done, so its host is not shut down yet (that ends every request
  ** first). Past the grace period the shutdown cancels it itself. */
  if (!enter(req->host, true)) return 0;
  int rc = lums_req_cancel(&req->r) ? 0 : UMS_ESRCH;
  leave(req->host);
  return rc;
}

void ums_lua_req_free(ums_lua_req_t *req) {
  if (req) lshared_unref(&req->r.h);
}

/* ---------------------------------------------------------------------- */
/* The host                                                                */
/* ---------------------------------------------------------------------- */

ums_lua_host_t *ums_lua_host_new(const ums_lua_host_config_t *cfg,
                                 int *err) {
  ums_lua_host_config_t c;
  int rc = 0;
  last_error[0] = '\0';
  if (cfg)
    c = *cfg;
  else
    memset(&c, 0, sizeof c);
  if (c.runtime.stack_size == 0) c.runtime.stack_size = HOST_STACK_SIZE;
  if (c.runtime.stack_size < UMS_LUA_STACK_SIZE_MIN) {
    if (err) *err = UMS_EINVAL;
    fail(UMS_EINVAL, "ums_lua_host_new: stack_size = %zu is out of range "
                     "for Lua (0: the default, or %d (UMS_LUA_STACK_SIZE_MIN) "
                     "to %zu)",
         c.runtime.stack_size, UMS_LUA_STACK_SIZE_MIN, UMS_STACK_SIZE_MAX);
    return NULL;
  }
  int64_t quantum = c.quantum == 0  ? HOST_QUANTUM_NS
                    : c.quantum < 0 ? 0
                                    : (int64_t)(c.quantum * 1e9);
  ums_lua_host_t *h = calloc(1, sizeof *h);
  if (!h) {
    rc = UMS_ENOMEM;
    goto failed;
  }
  h->rt = ums_runtime_new(&c.runtime, &rc);
  if (!h->rt) {
    free(h);
    if (err) *err = rc;
    return NULL_FAIL(rc, "ums_lua_host_new: %s", ums_runtime_error());
  }
  h->nsched = ums_runtime_schedulers(h->rt);
  h->run = lums_run_new_hosted(h->rt, &lums_vm_ops_module, c.path,
                               c.cpath, c.init, quantum, c.setup,
                               c.setup_arg);
  if (h->run) {
    const char *env = getenv("UMS_PREEMPT");
    lums_run_set_preempt(h->run, c.preempt > 0 || (c.preempt == 0 && env &&
                                                   strcmp(env, "1") == 0));
  }
  int terr = 0;
  h->monitor = h->run ? lums_monitor_new(h->rt, h->nsched, quantum, false,
                                         false, &terr) : NULL;
  if (h->monitor) lums_run_set_monitor(h->run, h->monitor);
  if (!h->monitor) {
    ums_runtime_shutdown(h->rt, 0);
    if (h->run) lums_run_close(NULL, h->run);
    free(h);
    rc = terr ? UMS_EAGAIN : UMS_ENOMEM;
    if (err) *err = rc;
    if (terr)
      return NULL_FAIL(rc, "ums_lua_host_new: cannot create the monitor "
                       "thread: %s (quantum < 0 runs without one)",
                       ums_strerror(terr));
    return NULL_FAIL(rc, "ums_lua_host_new: out of memory");
  }
  pthread_mutex_init(&h->lock, NULL);
  pthread_cond_init(&h->cond, NULL);
  h->state = H_RUNNING;
  return h;
failed:
  free(h);
  if (err) *err = rc;
  fail(rc, "ums_lua_host_new: %s", ums_strerror(rc));
  return NULL;
}

ums_runtime_t *ums_lua_host_runtime(ums_lua_host_t *h) {
  if (!h) return NULL;
  pthread_mutex_lock(&h->lock);
  ums_runtime_t *rt = h->state == H_RUNNING ? h->rt : NULL;
  pthread_mutex_unlock(&h->lock);
  return rt;
}

int ums_lua_host_stats(ums_lua_host_t *h, ums_lua_host_stats_t *out) {
  last_error[0] = '\0';
  if (!h || !out) return fail(UMS_EINVAL, "ums_lua_host_stats: NULL");
  memset(out, 0, sizeof *out);
  out->schedulers = h->nsched;
  /* Ended counts first: in_flight can only be overstated, never wrap. */
  out->ok = atomic_load(&h->ok);
  out->errors = atomic_load(&h->errors);
  out->cancelled = atomic_load(&h->cancelled);
  out->submitted = atomic_load(&h->submitted);
  out->in_flight = out->submitted - out->ok - out->errors - out->cancelled;
  if (enter(h, true)) {
    for (int i = 0; i < h->nsched; i++)
      if (lums_run_at(h->run, i)) out->vms++;
    leave(h);
  } else {
    pthread_mutex_lock(&h->lock);
    out->vms = h->vms_made;
    pthread_mutex_unlock(&h->lock);
  }
  return 0;
}

int ums_lua_host_shutdown(ums_lua_host_t *h, int64_t deadline) {
  last_error[0] = '\0';
  if (!h) return fail(UMS_EINVAL, "ums_lua_host_shutdown: host is NULL");
  pthread_mutex_lock(&h->lock);
  if (h->state != H_RUNNING) {
    while (h->state != H_CLOSED) pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
    return fail(UMS_ESHUTDOWN, "ums_lua_host_shutdown: already shut down");
  }
  if (ums_current_runtime() == h->rt) {
    pthread_mutex_unlock(&h->lock);
    return fail(UMS_EDEADLK, "ums_lua_host_shutdown: called from a task "
                "of the host's own runtime");
  }
  close_to(h, H_CLOSING);
  pthread_mutex_unlock(&h->lock);
  /* No submit is inside any more, and none can start. The work there is
  ** (requests, the Lua tasks they spawned) may run until the deadline;
  ** what is left then is cancelled. */
  bool quiet = lums_run_wait_quiet(h->run, deadline);
  pthread_mutex_lock(&h->lock);
  close_to(h, H_TEARDOWN);
  pthread_mutex_unlock(&h->lock);
  if (!quiet) lums_run_stop(h->run);
  int rc = ums_runtime_shutdown(h->rt, quiet ? deadline : 0);
  if (!quiet) rc = UMS_ETIMEDOUT;
  /* Every scheduler thread is joined: the VMs are this thread's to close,
  ** and the requests never started end here (cancelled, callbacks on
  ** this thread). */
  lums_monitor_free(h->monitor);
  h->monitor = NULL;
  int made = 0;
  for (int i = 0; i < h->nsched; i++)
    if (lums_run_at(h->run, i)) made++;
  lums_run_close(NULL, h->run);
  pthread_mutex_lock(&h->lock);
  h->vms_made = made;
  h->run = NULL;
  h->rt = NULL;
  h->state = H_CLOSED;
  pthread_cond_broadcast(&h->cond);
  pthread_mutex_unlock(&h->lock);
  return rc;
}

void ums_lua_host_delete(ums_lua_host_t *h) {
  if (!h) return;
  pthread_mutex_lock(&h->lock);
  bool closed = h->state == H_CLOSED;
  pthread_mutex_unlock(&h->lock);
  /* Shuts down, or waits for a shutdown begun elsewhere to end. */
  if (!closed) ums_lua_host_shutdown(h, UMS_FOREVER);
  pthread_mutex_destroy(&h->lock);
  pthread_cond_destroy(&h->cond);
  free(h);
}
