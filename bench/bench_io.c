/*
** bench_io.c: ums file I/O next to plain C on one thread, in one run, warm
** page cache. Every figure is the median (and best) of --reps runs; ratios
** are medians over the floor's median from the same run.
**
**   big_c_read        the floor: one 1 GiB file (DIR/big-pattern.dat) read
**                     with read(2) in 1 MiB chunks into a page-aligned
**                     buffer, one thread; MB/s.
**   big_uring/pool    the same file read by one task with ums_fs_read in
**                     1 MiB chunks (io_uring backend, then the pool).
**   big64_uring/pool  the same file read by 64 tasks, each a contiguous
**                     slice, 1 MiB chunks, on every scheduler.
**   small_c           the floor: 10,000 files of 4 KiB, each opened, read
**                     and closed with plain system calls, one thread;
**                     files per second.
**   small64_uring/pool  the same files opened, read and closed by 64
**                     tasks with ums_fs_open/read/close.
**   small64_1s        the same with io_uring on a runtime of one
**                     scheduler (the Lua binding's case: every Lua task
**                     runs on scheduler 0): the ceiling for one thread.
**   small64_step_1s   the same, one scheduler, with 64 step tasks using
**                     the deferred form (ums_fs_*_begin, return
**                     UMS_STEP_PARK, ums_fs_end): no worker per request
**                     in flight, as ums.fs runs.
**
** Usage: bench_io [--quick] [--reps N] [--dir PATH]
**   --dir    where the test files live (default /tmp/ums-bench-io); they
**            are created when missing or of the wrong size, and read once
**            before timing so the cache is warm.
**   --quick  a 64 MiB file and 500 small files (ctest: bench_io_smoke).
** Exits 1 if any call fails or any data read back is wrong.
*/
#include "ums.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)
#define NTASKS 64

static struct {
  int reps;
  bool quick;
  const char *dir;
  int64_t big_size;
  int nsmall;
} S;

static char big_path[600];

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what, int64_t rc) {
  fprintf(stderr, "bench_io: %s: %s\n", what,
          rc < 0 ? ums_strerror((int)rc) : strerror(errno));
  exit(1);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct result {
  const char *name, *unit;
  double median, best;
  const char *ratio_to;
  double ratio;
  char notes[96];
} result_t;

static result_t results[16];
static int nresults;

static result_t *add(const char *name, const char *unit, double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  result_t *r = &results[nresults++];
  memset(r, 0, sizeof *r);
  r->name = name;
  r->unit = unit;
  r->median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  r->best = v[n - 1]; /* rates: higher is better */
  return r;
}

static void ratio(result_t *r, const char *to) {
  for (int i = 0; i < nresults; i++)
    if (strcmp(results[i].name, to) == 0 && results[i].median > 0) {
      r->ratio_to = to;
      r->ratio = r->median / results[i].median;
    }
}

/* ---------------------------------------------------------------------- */
/* Data set                                                                */
/* ---------------------------------------------------------------------- */

static uint8_t pattern(int64_t off) { return (uint8_t)(off / 4096 * 31 + 7); }

static void make_big(void) {
  /* Not big.dat: bench/lua/bench_fs.lua keeps a file of that name, of the
  ** same size but another content, in the same default directory, and the
  ** floor checks what it reads. An existing file is kept only if its size
  ** and its first and last chunks' pattern are this program's. */
  snprintf(big_path, sizeof big_path, "%s/big-pattern.dat", S.dir);
  struct stat st;
  if (stat(big_path, &st) == 0 && st.st_size == S.big_size) {
    int fd = open(big_path, O_RDONLY);
    uint8_t first = 0, last = 0;
    bool ok = fd >= 0 && pread(fd, &first, 1, 0) == 1 &&
              pread(fd, &last, 1, S.big_size - CHUNK) == 1 &&
              first == pattern(0) && last == pattern(S.big_size - CHUNK);
    if (fd >= 0) close(fd);
    if (ok) return;
  }
  int fd = open(big_path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) die("create big file", 0);
  uint8_t *buf = aligned_alloc(4096, CHUNK);
  for (int64_t off = 0; off < S.big_size; off += CHUNK) {
    for (int i = 0; i < CHUNK; i += 4096) memset(buf + i, pattern(off + i), 4096);
    if (write(fd, buf, CHUNK) != CHUNK) die("write big file", 0);
  }
  free(buf);
  close(fd);
}

static void small_path(char *out, int i) {
  snprintf(out, 640, "%s/small/%02d/f%05d", S.dir, i % 100, i);
}

static void make_small(void) {
  char p[640];
  snprintf(p, sizeof p, "%s/small", S.dir);
  mkdir(p, 0755);
  uint8_t buf[4096];
  for (int i = 0; i < S.nsmall; i++) {
    if (i < 100) {
      snprintf(p, sizeof p, "%s/small/%02d", S.dir, i);
      mkdir(p, 0755);
    }
    small_path(p, i);
    struct stat st;
    if (stat(p, &st) == 0 && st.st_size == 4096) continue;
    memset(buf, (uint8_t)i, sizeof buf);
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, buf, 4096) != 4096) die("create small file", 0);
    close(fd);
  }
}

/* ---------------------------------------------------------------------- */
/* Floors: one thread, plain C                                             */
/* ---------------------------------------------------------------------- */

static double c_big(void) {
  uint8_t *buf = aligned_alloc(4096, CHUNK);
  int fd = open(big_path, O_RDONLY);
  if (fd < 0) die("open", 0);
  int64_t t0 = now_ns(), total = 0;
  ssize_t n;
  while ((n = read(fd, buf, CHUNK)) > 0) total += n;
  int64_t t1 = now_ns();
  if (total != S.big_size || buf[0] != pattern(S.big_size - CHUNK))
    die("c_big: short or wrong read", 0);
  close(fd);
  free(buf);
  return (double)total / 1e6 / ((double)(t1 - t0) / 1e9);
}

static double c_small(void) {
  char p[640];
  uint8_t buf[4096] __attribute__((aligned(4096)));
  int64_t t0 = now_ns();
  for (int i = 0; i < S.nsmall; i++) {
    small_path(p, i);
    int fd = open(p, O_RDONLY);
    if (fd < 0 || read(fd, buf, 4096) != 4096 || buf[100] != (uint8_t)i)
      die("c_small", 0);
    close(fd);
  }
  return S.nsmall / ((double)(now_ns() - t0) / 1e9);
}

/* ---------------------------------------------------------------------- */
/* ums                                                                     */
/* ---------------------------------------------------------------------- */

typedef struct slice {
  int fd;
  int64_t from, to;
  int64_t bytes;
} slice_t;

static void *read_slice(void *arg) {
  slice_t *s = arg;
  ums_buf_t *b = ums_buf_new(CHUNK);
  for (int64_t off = s->from; off < s->to; off += CHUNK) {
    size_t len = (size_t)(s->to - off < CHUNK ? s->to - off : CHUNK);
    int64_t n = ums_fs_read(s->fd, b, 0, len, off, UMS_FOREVER);
    if (n < 0) die("ums_fs_read", n);
    if (n == 0) break;
    if (((uint8_t *)ums_buf_data(b))[0] != pattern(off)) die("wrong data", 0);
    s->bytes += n;
  }
  ums_buf_release(b);
  return NULL;
}

typedef struct small_job {
  _Atomic int *next;
  int done;
} small_job_t;

static void *read_small(void *arg) {
  small_job_t *j = arg;
  char p[640];
  ums_buf_t *b = ums_buf_new(4096);
  for (;;) {
    int i = atomic_fetch_add(j->next, 1);
    if (i >= S.nsmall) break;
    small_path(p, i);
    int fd = ums_fs_open(p, O_RDONLY, 0, UMS_FOREVER);
    if (fd < 0) die("ums_fs_open", fd);
    int64_t n = ums_fs_read(fd, b, 0, 4096, 0, UMS_FOREVER);
    if (n != 4096 || ((uint8_t *)ums_buf_data(b))[100] != (uint8_t)i)
      die("ums_fs_read small", n);
    int rc = ums_fs_close(fd, UMS_FOREVER);
    if (rc) die("ums_fs_close", rc);
    j->done++;
  }
  ums_buf_release(b);
  return NULL;
}

/* A step task reading small files with the deferred form: each request
** is begun in one step and ended in the next, the task holding no worker
** in between. */
typedef struct small_step {
  _Atomic int *next;
  int phase;             /* 0: take a file; 1, 2, 3: open, read, close in
                            flight */
  int i, fd;
  ums_buf_t *b;
  ums_fs_req_t *q;
  int done;
} small_step_t;

static int step_small(void *arg) {
  small_step_t *j = arg;
  char p[640];
  int64_t r;
next:
  switch (j->phase) {
    case 0:
      if (!j->b) j->b = ums_buf_new(4096);
      j->i = atomic_fetch_add(j->next, 1);
      if (j->i >= S.nsmall) {
        ums_buf_release(j->b);
        return UMS_STEP_DONE;
      }
      small_path(p, j->i);
      if ((r = ums_fs_open_begin(p, O_RDONLY, 0, UMS_FOREVER, &j->q)))
        die("ums_fs_open_begin", r);
      j->phase = 1;
      return UMS_STEP_PARK;
    case 1:
      if ((r = ums_fs_end(j->q)) < 0) die("ums_fs_open (step)", r);
      j->fd = (int)r;
      if ((r = ums_fs_read_begin(j->fd, j->b, 0, 4096, 0, UMS_FOREVER,
                                 &j->q)))
        die("ums_fs_read_begin", r);
      j->phase = 2;
      return UMS_STEP_PARK;
    case 2:
      r = ums_fs_end(j->q);
      if (r != 4096 || ((uint8_t *)ums_buf_data(j->b))[100] != (uint8_t)j->i)
        die("ums_fs_read small (step)", r);
      if ((r = ums_fs_close_begin(j->fd, UMS_FOREVER, &j->q)))
        die("ums_fs_close_begin", r);
      j->phase = 3;
      return UMS_STEP_PARK;
    default:
      if ((r = ums_fs_end(j->q))) die("ums_fs_close (step)", r);
      j->done++;
      j->phase = 0;
      goto next;
  }
}

static ums_runtime_t *runtime_n(int backend, int schedulers) {
  ums_config_t cfg = {.io_backend = backend, .schedulers = schedulers};
  int err = 0;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (!rt) die("ums_runtime_new", err);
  return rt;
}

static ums_runtime_t *runtime(int backend) {
  ums_config_t cfg = {.io_backend = backend};
  int err = 0;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (!rt) die("ums_runtime_new", err);
  return rt;
}

static void run_tasks(ums_runtime_t *rt, int n, ums_task_fn fn, void *args,
                      size_t arg_size) {
  ums_task_t t[NTASKS];
  int ns = ums_runtime_schedulers(rt);
  for (int i = 0; i < n; i++) {
    ums_spawn_opts_t o = {.sched = i % ns};
    int rc = ums_task_spawn(rt, &o, fn, (char *)args + i * arg_size, &t[i]);
    if (rc) die("spawn", rc);
  }
  for (int i = 0; i < n; i++) ums_task_join(rt, t[i], UMS_FOREVER, NULL, NULL);
}

static double ums_big(ums_runtime_t *rt, int ntasks) {
  int fd = open(big_path, O_RDONLY | O_CLOEXEC);
  slice_t sl[NTASKS];
  int64_t per = (S.big_size / ntasks + CHUNK - 1) / CHUNK * CHUNK;
  for (int i = 0; i < ntasks; i++) {
    int64_t from = per * i, to = from + per;
    sl[i] = (slice_t){fd, from < S.big_size ? from : S.big_size,
                      to < S.big_size ? to : S.big_size, 0};
  }
  int64_t t0 = now_ns();
  run_tasks(rt, ntasks, read_slice, sl, sizeof *sl);
  int64_t t1 = now_ns(), total = 0;
  for (int i = 0; i < ntasks; i++) total += sl[i].bytes;
  if (total != S.big_size) die("ums_big: short read", 0);
  close(fd);
  return (double)total / 1e6 / ((double)(t1 - t0) / 1e9);
}

static double ums_small(ums_runtime_t *rt) {
  _Atomic int next = 0;
  small_job_t jobs[NTASKS];
  for (int i = 0; i < NTASKS; i++) jobs[i] = (small_job_t){&next, 0};
  int64_t t0 = now_ns();
  run_tasks(rt, NTASKS, read_small, jobs, sizeof *jobs);
  double rate = S.nsmall / ((double)(now_ns() - t0) / 1e9);
  int done = 0;
  for (int i = 0; i < NTASKS; i++) done += jobs[i].done;
  if (done != S.nsmall) die("ums_small: files missed", 0);
  return rate;
}

static double ums_small_step(ums_runtime_t *rt) {
  _Atomic int next = 0;
  small_step_t jobs[NTASKS];
  ums_task_t t[NTASKS];
  memset(jobs, 0, sizeof jobs);
  int64_t t0 = now_ns();
  for (int i = 0; i < NTASKS; i++) {
    jobs[i].next = &next;
    int rc = ums_task_spawn_step(rt, NULL, step_small, &jobs[i], &t[i]);
    if (rc) die("spawn step", rc);
  }
  for (int i = 0; i < NTASKS; i++) ums_task_join(rt, t[i], UMS_FOREVER, NULL, NULL);
  double rate = S.nsmall / ((double)(now_ns() - t0) / 1e9);
  int done = 0;
  for (int i = 0; i < NTASKS; i++) done += jobs[i].done;
  if (done != S.nsmall) die("ums_small_step: files missed", 0);
  return rate;
}

static uint64_t submits(ums_runtime_t *rt, uint64_t *reqs) {
  ums_sched_stats_t rows[64];
  int n = ums_runtime_stats(rt, rows, 64);
  uint64_t s = 0, r = 0;
  for (int i = 0; i < n && i < 64; i++) {
    s += rows[i].io_submits;
    r += rows[i].io_requests;
  }
  *reqs = r;
  return s;
}

int main(int argc, char **argv) {
  S.reps = 5;
  S.dir = "/tmp/ums-bench-io";
  S.big_size = INT64_C(1) << 30;
  S.nsmall = 10000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      S.quick = true;
    } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      S.reps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
      S.dir = argv[++i];
    } else {
      fprintf(stderr, "usage: bench_io [--quick] [--reps N] [--dir PATH]\n");
      return 2;
    }
  }
  if (S.quick) {
    S.big_size = INT64_C(64) << 20;
    S.nsmall = 500;
    if (S.reps == 5) S.reps = 1;
  }
  if (S.reps < 1 || S.reps > 64) S.reps = 5;
  mkdir(S.dir, 0755);
  if (S.quick) {
    /* Its own files, so a smoke run never resizes a real data set. */
    static char qdir[600];
    snprintf(qdir, sizeof qdir, "%s/quick", S.dir);
    mkdir(qdir, 0755);
    S.dir = qdir;
  }
  make_big();
  make_small();
  /* Warm the cache (the VM pages out what stays idle for a minute). */
  c_big();
  c_small();

  ums_runtime_t *rt_u = runtime(UMS_IO_AUTO);
  ums_config_t c;
  ums_runtime_config(rt_u, &c);
  bool have_uring = c.io_backend == UMS_IO_URING;
  ums_runtime_t *rt_p = runtime(UMS_IO_POOL);
  ums_runtime_t *rt_1 = have_uring ? runtime_n(UMS_IO_URING, 1) : NULL;

  double v[10][64];
  uint64_t sub0 = 0, req0 = 0, sub1 = 0, req1 = 0;
  for (int rep = 0; rep < S.reps; rep++) {
    v[0][rep] = c_big();
    v[1][rep] = have_uring ? ums_big(rt_u, 1) : 0;
    v[2][rep] = ums_big(rt_p, 1);
    v[3][rep] = have_uring ? ums_big(rt_u, NTASKS) : 0;
    v[4][rep] = ums_big(rt_p, NTASKS);
    v[5][rep] = c_small();
    uint64_t s0, r0, s1, r1;
    s0 = submits(rt_u, &r0);
    v[6][rep] = have_uring ? ums_small(rt_u) : 0;
    s1 = submits(rt_u, &r1);
    sub0 += s0, req0 += r0, sub1 += s1, req1 += r1;
    v[7][rep] = ums_small(rt_p);
    v[8][rep] = have_uring ? ums_small(rt_1) : 0;
    v[9][rep] = have_uring ? ums_small_step(rt_1) : 0;
  }
  result_t *r;
  add("big_c_read", "MB/s", v[0], S.reps);
  if (have_uring) {
    r = add("big_uring", "MB/s", v[1], S.reps);
    ratio(r, "big_c_read");
    snprintf(r->notes, sizeof r->notes, "1 task, 1 MiB reads");
  }
  r = add("big_pool", "MB/s", v[2], S.reps);
  ratio(r, "big_c_read");
  snprintf(r->notes, sizeof r->notes, "1 task, 1 MiB reads");
  if (have_uring) {
    r = add("big64_uring", "MB/s", v[3], S.reps);
    ratio(r, "big_c_read");
    snprintf(r->notes, sizeof r->notes, "64 tasks, one slice each");
  }
  r = add("big64_pool", "MB/s", v[4], S.reps);
  ratio(r, "big_c_read");
  snprintf(r->notes, sizeof r->notes, "64 tasks, one slice each");
  add("small_c", "files/s", v[5], S.reps);
  if (have_uring) {
    r = add("small64_uring", "files/s", v[6], S.reps);
    ratio(r, "small_c");
    snprintf(r->notes, sizeof r->notes,
             "64 tasks; %.1f requests per ring submit",
             sub1 > sub0 ? (double)(req1 - req0) / (double)(sub1 - sub0) : 0.0);
  }
  r = add("small64_pool", "files/s", v[7], S.reps);
  ratio(r, "small_c");
  snprintf(r->notes, sizeof r->notes, "64 tasks, pool of %d threads",
           c.io_pool_threads);
  if (have_uring) {
    r = add("small64_1s", "files/s", v[8], S.reps);
    ratio(r, "small_c");
    snprintf(r->notes, sizeof r->notes, "64 tasks, one scheduler");
    r = add("small64_step_1s", "files/s", v[9], S.reps);
    ratio(r, "small_c");
    snprintf(r->notes, sizeof r->notes,
             "64 step tasks, deferred form, one scheduler");
  }
  ums_runtime_shutdown(rt_u, UMS_FOREVER);
  ums_runtime_shutdown(rt_p, UMS_FOREVER);
  if (rt_1) ums_runtime_shutdown(rt_1, UMS_FOREVER);

  printf("ums bench_io: median and best of %d reps%s; %s, %" PRId64
         " MiB file, %d small files, %d schedulers\n\n",
         S.reps, S.quick ? ", --quick" : "", S.dir, S.big_size >> 20,
         S.nsmall, c.schedulers);
  printf("%-15s %10s %10s %-8s %-18s %s\n", "figure", "median", "best", "unit",
         "ratio (median)", "notes");
  for (int i = 0; i < nresults; i++) {
    const result_t *x = &results[i];
    char rs[40] = "";
    if (x->ratio_to) snprintf(rs, sizeof rs, "%.2fx %s", x->ratio, x->ratio_to);
    printf("%-15s %10.0f %10.0f %-8s %-18s %s\n", x->name, x->median, x->best,
           x->unit, rs, x->notes);
  }
  return 0;
}
