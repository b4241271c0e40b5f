/*
** jobrun: a host program that embeds ums (ums-lua.h). It reads job lines
** from a file (or stdin), runs each as a Lua work request on the
** least-loaded scheduler and prints each outcome as it completes:
**
**   jobrun [jobs-file]
**
**   <timeout in seconds>  <module.function>  <arguments...>
**   <timeout in seconds>  =  <a chunk of Lua source>
**
** Arguments are integers, floats, true/false/nil or words (strings).
** Blank lines and lines starting with '#' are skipped. The Lua modules
** are found through LUA_PATH (jobs.lua next to this file, the ums stdlib).
**
** What it shows: the setup function that registers the host's C
** functions in every VM; the input read by a C task with ums file I/O;
** one C task per job that submits it and waits with the job's deadline,
** cancelling it when the deadline passes (parking only that task);
** results printed by the completion callback; the stats at the end; a
** shutdown that leaves nothing behind. Exit status: 0 when every job ran
** (whatever its outcome), 1 on a runner error.
*/
#define _GNU_SOURCE
#include "ums-lua.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_JOBS 1024
#define MAX_ARGS 16

typedef struct job {
  int no;                      /* line number */
  char *line;                  /* [owned] the job's text */
  double timeout;              /* seconds */
  _Atomic int timed_out;       /* set before the runner cancels it */
  ums_lua_host_t *host;
} job;

static atomic_int n_ok, n_error, n_timeout;

/* ---- Printing values ---- */

static void print_value(FILE *f, const ums_lua_value_t *v, int depth) {
  switch (v->type) {
    case UMS_LUA_TNIL: fputs("nil", f); break;
    case UMS_LUA_TBOOLEAN: fputs(v->u.boolean ? "true" : "false", f); break;
    case UMS_LUA_TINTEGER: fprintf(f, "%lld", (long long)v->u.integer); break;
    case UMS_LUA_TFLOAT: fprintf(f, "%.14g", v->u.number); break;
    case UMS_LUA_TSTRING: fprintf(f, "\"%s\"", v->u.string.ptr); break;
    case UMS_LUA_TTABLE:
      if (depth > 3) {
        fputs("{...}", f);
        break;
      }
      fputc('{', f);
      for (size_t i = 0; i < v->u.table.n; i++) {
        const ums_lua_field_t *fl = &v->u.table.fields[i];
        if (i) fputs(", ", f);
        if (fl->key.type == UMS_LUA_TSTRING) {
          fputs(fl->key.u.string.ptr, f);
        } else {
          fputc('[', f);
          print_value(f, &fl->key, depth + 1);
          fputc(']', f);
        }
        fputs(" = ", f);
        print_value(f, &fl->value, depth + 1);
      }
      fputc('}', f);
      break;
  }
}

/* The completion callback: on a scheduler thread, once per job. */
static void job_done(ums_lua_req_t *req, const ums_lua_result_t *res,
                     void *arg) {
  job *j = arg;
  (void)req;
  flockfile(stdout);
  printf("[job %d] ", j->no);
  if (res->status == UMS_LUA_REQ_OK) {
    atomic_fetch_add(&n_ok, 1);
    printf("ok (scheduler %d):", res->sched);
    for (int i = 0; i < res->nvalues; i++) {
      putchar(' ');
      print_value(stdout, &res->values[i], 0);
    }
    putchar('\n');
  } else if (res->status == UMS_LUA_REQ_ERROR) {
    atomic_fetch_add(&n_error, 1);
    /* The first line of the traceback says where it was raised. */
    const char *tb = res->traceback ? strchr(res->traceback, '\n') : NULL;
    printf("error: %s\n", res->error);
    if (tb && tb[1]) printf("        %.*s\n", (int)strcspn(tb + 1, "\n"),
                            tb + 1);
  } else if (atomic_load(&j->timed_out)) {
    atomic_fetch_add(&n_timeout, 1);
    printf("timed out after %g s (cancelled)\n", j->timeout);
  } else {
    atomic_fetch_add(&n_error, 1);
    printf("cancelled: %s\n", res->error);
  }
  funlockfile(stdout);
  fflush(stdout);
}

/* ---- Parsing a job line into a request ---- */

static ums_lua_value_t parse_arg(const char *tok) {
  char *end;
  long long i = strtoll(tok, &end, 10);
  if (*tok && !*end) return ums_lua_integer(i);
  double d = strtod(tok, &end);
  if (*tok && !*end) return ums_lua_float(d);
  if (strcmp(tok, "true") == 0) return ums_lua_boolean(1);
  if (strcmp(tok, "false") == 0) return ums_lua_boolean(0);
  if (strcmp(tok, "nil") == 0) return ums_lua_nil();
  return ums_lua_string(tok);
}

/* A C task per job: submits it, waits until its deadline, cancels it if
** it is still running then. */
static void *job_task(void *p) {
  job *j = p;
  char *save = NULL, *line = j->line;
  char *tok = strtok_r(line, " \t", &save);
  j->timeout = strtod(tok, NULL);
  char *what = strtok_r(NULL, " \t", &save);
  ums_lua_submit_opts_t opts = {UMS_ANY_SCHED, job_done, j};
  ums_lua_req_t *req = NULL;
  int rc;
  if (what && strcmp(what, "=") == 0) {
    const char *src = save ? save : "";
    char name[32];
    snprintf(name, sizeof name, "=job %d", j->no);
    rc = ums_lua_submit_chunk(j->host, src, strlen(src), name, NULL, 0,
                              &opts, &req);
  } else {
    ums_lua_value_t args[MAX_ARGS];
    int n = 0;
    while (n < MAX_ARGS && (tok = strtok_r(NULL, " \t", &save)) != NULL)
      args[n++] = parse_arg(tok);
    rc = ums_lua_submit(j->host, what ? what : "", args, n, &opts, &req);
    for (int i = 0; i < n; i++) ums_lua_value_free(&args[i]);
  }
  if (rc != 0) {
    printf("[job %d] not submitted: %s\n", j->no, ums_lua_last_error());
    atomic_fetch_add(&n_error, 1);
    return NULL;
  }
  int64_t deadline = ums_deadline((int64_t)(j->timeout * 1e9));
  if (ums_lua_req_wait(req, deadline, NULL) == UMS_ETIMEDOUT) {
    atomic_store(&j->timed_out, 1);
    ums_lua_req_cancel(req);
    ums_lua_req_wait(req, UMS_FOREVER, NULL);
  }
  ums_lua_req_free(req);
  return NULL;
}

/* ---- The reader: a C task reading the input with ums file I/O ---- */

typedef struct reader {
  ums_lua_host_t *host;
  int fd;
  job jobs[MAX_JOBS];
  ums_task_t tasks[MAX_JOBS];
  int njobs;
  int failed;
} reader;

static void start_job(reader *r, int no, const char *line) {
  while (*line == ' ' || *line == '\t') line++;
  if (!*line || *line == '#') return;
  if (r->njobs == MAX_JOBS) {
    fprintf(stderr, "jobrun: more than %d jobs\n", MAX_JOBS);
    r->failed = 1;
    return;
  }
  job *j = &r->jobs[r->njobs];
  j->no = no;
  j->line = strdup(line);
  j->host = r->host;
  ums_spawn_opts_t o = {UMS_ANY_SCHED, 0, "job"};
  if (!j->line || ums_task_spawn(ums_current_runtime(), &o, job_task, j,
                                 &r->tasks[r->njobs]) != 0) {
    free(j->line);
    r->failed = 1;
    return;
  }
  r->njobs++;
}

static void *reader_task(void *p) {
  reader *r = p;
  ums_buf_t *buf = ums_buf_new(4096);
  char line[1024];
  size_t len = 0;
  int no = 0;
  int64_t n;
  while (buf && (n = ums_fs_read(r->fd, buf, 0, 4096, UMS_FS_CUR,
                                 UMS_FOREVER)) > 0) {
    const char *data = ums_buf_data(buf);
    for (int64_t i = 0; i < n; i++) {
      if (data[i] == '\n' || len == sizeof line - 1) {
        line[len] = '\0';
        start_job(r, ++no, line);
        len = 0;
      } else {
        line[len++] = data[i];
      }
    }
  }
  if (len) {
    line[len] = '\0';
    start_job(r, ++no, line);
  }
  ums_buf_release(buf);
  for (int i = 0; i < r->njobs; i++)
    ums_task_join(ums_current_runtime(), r->tasks[i], UMS_FOREVER, NULL,
                  NULL);
  return NULL;
}

/* ---- The host ---- */

/* host.log(msg): a C function every VM gets from the setup function. */
static int l_log(lua_State *L) {
  fprintf(stderr, "  (lua) %s\n", luaL_checkstring(L, 1));
  return 0;
}

static int setup(lua_State *L, int sched, void *arg) {
  (void)sched;
  (void)arg;
  lua_newtable(L);
  lua_pushcfunction(L, l_log);
  lua_setfield(L, -2, "log");
  lua_setglobal(L, "host");
  return 0;
}

int main(int argc, char **argv) {
  int fd = 0;
  if (argc > 1 && (fd = open(argv[1], O_RDONLY | O_CLOEXEC)) < 0) {
    perror(argv[1]);
    return 1;
  }
  ums_lua_host_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.runtime.schedulers = 2;
  cfg.setup = setup;
  int err;
  ums_lua_host_t *host = ums_lua_host_new(&cfg, &err);
  if (!host) {
    fprintf(stderr, "jobrun: %s\n", ums_lua_last_error());
    return 1;
  }
  static reader r;
  r.host = host;
  r.fd = fd;
  ums_runtime_t *rt = ums_lua_host_runtime(host);
  ums_task_t t;
  int rc = ums_task_spawn(rt, NULL, reader_task, &r, &t);
  if (rc == 0) rc = ums_task_join(rt, t, UMS_FOREVER, NULL, NULL);

  ums_lua_host_stats_t st;
  ums_lua_host_stats(host, &st);
  ums_sched_stats_t rows[8];
  int ns = ums_runtime_stats(rt, rows, 8);
  printf("stats: %llu requests on %d VMs;", (unsigned long long)st.submitted,
         st.vms);
  for (int i = 0; i < ns && i < 8; i++)
    printf(" scheduler %d: %llu tasks started", i,
           (unsigned long long)rows[i].tasks_spawned);
  printf("\n");
  ums_lua_host_delete(host);
  for (int i = 0; i < r.njobs; i++) free(r.jobs[i].line);
  if (fd > 0) close(fd);
  printf("summary: %d jobs, %d ok, %d error, %d timed out\n", r.njobs,
         atomic_load(&n_ok), atomic_load(&n_error), atomic_load(&n_timeout));
  return rc != 0 || r.failed ? 1 : 0;
}
