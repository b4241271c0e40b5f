/*
** test_io.c: file I/O (io.c and its two backends). ctest runs this program
** once per backend: as test_io (io_uring where the kernel allows it),
** as test_io_pool with UMS_IO=pool, and under strace with io_uring_setup
** failing (ENOSYS, EPERM: the runtime must fall back to the pool with the
** same results) and with io_uring_enter interrupted (EINTR: nothing may
** hang). --expect-backend=uring|pool makes the run fail if the runtime
** chose otherwise, so a fallback cannot pass by accident.
**
** Every check runs in a task and, where it makes sense, on a host thread
** too (where the calls are plain system calls).
*/
#include "internal.h"
#include "test-util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>

#define PTR(x) ((void *)(uintptr_t)(x))

static char dir[200];
static int expect_backend = -1;
static ums_runtime_t *rt;

static char *path_of(char *buf, const char *name) {
  snprintf(buf, 512, "%s/%.200s", dir, name);
  return buf;
}

static uint64_t io_pending(void) { return tu_stats_sum(rt, io_pending); }

/* Waits (2 s) for an abandoned read of a pipe to end: cancelled in the
** kernel, or interrupted on its pool thread. A pool interrupt is best
** effort (a signal that lands just before the thread enters read() is
** lost; docs/design/io.md): then the read ends when data comes, which this
** writes to wfd. Returns whether the interrupt was lost. */
static bool settle_abandoned_read(int wfd) {
  int64_t until = ums_deadline(2 * UMS_NSEC_PER_SEC);
  while (io_pending() != 0 && ums_now() < until) usleep(1000);
  if (io_pending() == 0) return false;
  CHECK_EQ(write(wfd, "y", 1), 1);
  WAIT_UNTIL(io_pending() == 0, 5000);
  return true;
}

/* Pipes an abandoned request may still use: the stats say when it has
** ended, but they are not a synchronisation, so the descriptors are
** closed only after the runtime (and its pool threads) are gone. */
static int late_fds[64];
static int nlate;

static void close_late(int fd) {
  CHECK_LT(nlate, 64);
  late_fds[nlate++] = fd;
}

static void fill(ums_buf_t *b, size_t n, uint8_t seed) {
  uint8_t *p = ums_buf_data(b);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed + i * 7);
}

static bool same(const ums_buf_t *b, size_t n, uint8_t seed) {
  const uint8_t *p = ums_buf_data(b);
  for (size_t i = 0; i < n; i++)
    if (p[i] != (uint8_t)(seed + i * 7)) return false;
  return true;
}

/* ====================================================================== */
/* The backend in force                                                    */
/* ====================================================================== */

static void test_backend(void) {
  ums_config_t c;
  ums_runtime_config(rt, &c);
  const char *env = getenv("UMS_IO");
  printf("   backend: %s\n", c.io_backend == UMS_IO_URING ? "io_uring" : "pool");
  if (env && strcmp(env, "pool") == 0) CHECK_EQ(c.io_backend, UMS_IO_POOL);
  if (expect_backend >= 0) CHECK_EQ(c.io_backend, expect_backend);

  /* Asking for a backend explicitly. */
  ums_config_t pool = {.schedulers = 1, .io_backend = UMS_IO_POOL};
  ums_runtime_t *r2 = tu_runtime_new_cfg(&pool);
  ums_runtime_config(r2, &c);
  CHECK_EQ(c.io_backend, UMS_IO_POOL);
  tu_runtime_shutdown(r2);

  ums_config_t uring = {.schedulers = 1, .io_backend = UMS_IO_URING};
  int err = 1;
  r2 = ums_runtime_new(&uring, &err);
  if (expect_backend == UMS_IO_POOL && !(env && strcmp(env, "pool") == 0)) {
    /* io_uring_setup fails in this run: an explicit request says why. */
    CHECK(r2 == NULL);
    CHECK(err == UMS_ENOSYS || err == UMS_EPERM);
    printf("   explicit io_uring refused: %s\n", ums_err_name(err));
  } else if (r2) {
    CHECK_RC(err, 0);
    ums_runtime_config(r2, &c);
    CHECK_EQ(c.io_backend, UMS_IO_URING);
    tu_live_runtimes++;
    tu_runtime_shutdown(r2);
  }
}

/* ====================================================================== */
/* Every call, in a task and on a host thread                              */
/* ====================================================================== */

static void *ops_suite(void *arg) {
  const char *tag = arg;
  char sub[512], file[600], file2[600], link[600], tmp[100];
  snprintf(tmp, sizeof tmp, "ops-%s", tag);
  path_of(sub, tmp);
  snprintf(file, sizeof file, "%s/a.dat", sub);
  snprintf(file2, sizeof file2, "%s/b.dat", sub);
  snprintf(link, sizeof link, "%s/link", sub);
  int64_t dl = ums_deadline(10 * UMS_NSEC_PER_SEC);

  CHECK_RC(ums_fs_mkdir(sub, 0755, dl), 0);
  CHECK_RC(ums_fs_mkdir(sub, 0755, dl), UMS_EEXIST);
  int fd = ums_fs_open(file, O_CREAT | O_RDWR | O_TRUNC, 0644, dl);
  CHECK_GE(fd, 0);
  CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);

  /* write / read at offsets */
  ums_buf_t *w = ums_buf_new(100000), *r = ums_buf_new(100000);
  CHECK(w && r);
  fill(w, 100000, 3);
  CHECK_EQ(ums_fs_write(fd, w, 0, 100000, 0, dl), 100000);
  CHECK_EQ(ums_fs_write(fd, w, 10, 50, 200000, dl), 50);  /* a hole */
  memset(ums_buf_data(r), 0xee, 100000);
  CHECK_EQ(ums_fs_read(fd, r, 0, 100000, 0, dl), 100000);
  CHECK(same(r, 100000, 3));
  CHECK_EQ(ums_fs_read(fd, r, 1000, 50, 200000, dl), 50);
  CHECK(memcmp((char *)ums_buf_data(r) + 1000, (char *)ums_buf_data(w) + 10,
               50) == 0);
  CHECK_EQ(ums_fs_read(fd, r, 0, 100, 150000, dl), 100);  /* the hole */
  for (int i = 0; i < 100; i++) CHECK_EQ(((uint8_t *)ums_buf_data(r))[i], 0);
  CHECK_EQ(ums_fs_read(fd, r, 0, 100, 200050, dl), 0);    /* end of file */
  CHECK_EQ(ums_fs_read(fd, r, 0, 0, 0, dl), 0);           /* nothing */

  /* UMS_FS_CUR: the file position moves */
  CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
  CHECK_EQ(ums_fs_read(fd, r, 0, 10, UMS_FS_CUR, dl), 10);
  CHECK_EQ(ums_fs_read(fd, r, 10, 10, UMS_FS_CUR, dl), 10);
  CHECK(same(r, 20, 3));
  CHECK_EQ(lseek(fd, 0, SEEK_CUR), 20);
  /* while explicit offsets leave it alone */
  CHECK_EQ(ums_fs_read(fd, r, 0, 10, 500, dl), 10);
  CHECK_EQ(lseek(fd, 0, SEEK_CUR), 20);

  /* readv / writev over three buffers, one range starting mid-buffer */
  ums_buf_t *a = ums_buf_new(4096), *b = ums_buf_new(10), *c = ums_buf_new(70000);
  fill(a, 4096, 11);
  fill(b, 10, 22);
  fill(c, 70000, 33);
  ums_iov_t out[3] = {{a, 0, 4096}, {b, 0, 10}, {c, 5, 69995}};
  CHECK_EQ(ums_fs_writev(fd, out, 3, 300000, dl), 4096 + 10 + 69995);
  ums_buf_t *back = ums_buf_new(80000);
  ums_buf_t *back2 = ums_buf_new(2);
  ums_iov_t in[2] = {{back2, 0, 2}, {back, 0, 80000}};
  CHECK_EQ(ums_fs_readv(fd, in, 2, 300000, dl), 4096 + 10 + 69995);
  CHECK(memcmp(ums_buf_data(back2), ums_buf_data(a), 2) == 0);
  uint8_t *bp = ums_buf_data(back);
  CHECK(memcmp(bp, (uint8_t *)ums_buf_data(a) + 2, 4094) == 0);
  CHECK(memcmp(bp + 4094, ums_buf_data(b), 10) == 0);
  CHECK(memcmp(bp + 4104, (uint8_t *)ums_buf_data(c) + 5, 69995) == 0);
  /* more elements than fit inline in a request */
  ums_iov_t many[40];
  for (int i = 0; i < 40; i++) many[i] = (ums_iov_t){a, (size_t)i, 1};
  CHECK_EQ(ums_fs_writev(fd, many, 40, 400000, dl), 40);
  for (int i = 0; i < 40; i++) many[i] = (ums_iov_t){back, (size_t)(39 - i), 1};
  CHECK_EQ(ums_fs_readv(fd, many, 40, 400000, dl), 40);
  for (int i = 0; i < 40; i++)
    CHECK_EQ(bp[39 - i], ((uint8_t *)ums_buf_data(a))[i]);

  CHECK_RC(ums_fs_fsync(fd, 0, dl), 0);
  CHECK_RC(ums_fs_fsync(fd, UMS_FS_DATASYNC, dl), 0);

  /* stat, fstat, lstat */
  ums_stat_t st, st2;
  CHECK_RC(ums_fs_fstat(fd, &st, dl), 0);
  CHECK_EQ(st.size, 400040);
  CHECK(S_ISREG(st.mode));
  mode_t mask = umask(0);
  umask(mask);
  CHECK_EQ(st.mode & 0777, 0644 & ~mask);
  CHECK_EQ(st.nlink, 1);
  CHECK_EQ(st.uid, getuid());
  CHECK_GT(st.mtime, 0);
  CHECK_RC(ums_fs_stat(file, 0, &st2, dl), 0);
  CHECK_EQ(st2.ino, st.ino);
  CHECK_EQ(st2.dev, st.dev);
  struct stat ref;
  CHECK_EQ(stat(file, &ref), 0);
  CHECK_EQ(st2.ino, ref.st_ino);
  CHECK_EQ(st2.dev, ref.st_dev);
  CHECK_EQ(st2.blocks, ref.st_blocks);
  CHECK_EQ(st2.mtime, (int64_t)ref.st_mtim.tv_sec * UMS_NSEC_PER_SEC +
                          ref.st_mtim.tv_nsec);
  CHECK_EQ(symlink("a.dat", link), 0);
  CHECK_RC(ums_fs_stat(link, 0, &st2, dl), 0);
  CHECK_EQ(st2.ino, st.ino);
  CHECK_RC(ums_fs_stat(link, UMS_FS_NOFOLLOW, &st2, dl), 0);
  CHECK(S_ISLNK(st2.mode));
  CHECK_RC(ums_fs_stat(sub, 0, &st2, dl), 0);
  CHECK(S_ISDIR(st2.mode));

  /* rename, readdir */
  CHECK_RC(ums_fs_rename(file, file2, dl), 0);
  CHECK_RC(ums_fs_stat(file, 0, &st2, dl), UMS_ENOENT);
  CHECK_RC(ums_fs_stat(file2, 0, &st2, dl), 0);
  CHECK_EQ(st2.ino, st.ino);
  ums_dirlist_t *list = NULL;
  CHECK_RC(ums_fs_readdir(sub, &list, dl), 0);
  CHECK(list != NULL);
  CHECK_EQ(list->count, 2);
  bool seen_b = false, seen_link = false;
  for (size_t i = 0; i < list->count; i++) {
    if (strcmp(list->entries[i].name, "b.dat") == 0) {
      seen_b = true;
      CHECK(list->entries[i].type == DT_REG ||
            list->entries[i].type == DT_UNKNOWN);
      CHECK_EQ(list->entries[i].ino, st.ino);
    } else if (strcmp(list->entries[i].name, "link") == 0) {
      seen_link = true;
    }
  }
  CHECK(seen_b && seen_link);
  ums_dirlist_free(list);

  /* unlink, rmdir, close */
  CHECK_RC(ums_fs_rmdir(sub, dl), UMS_ENOTEMPTY);
  CHECK_RC(ums_fs_unlink(link, dl), 0);
  CHECK_RC(ums_fs_unlink(file2, dl), 0);
  CHECK_RC(ums_fs_unlink(file2, dl), UMS_ENOENT);
  CHECK_RC(ums_fs_readdir(sub, &list, dl), 0);
  CHECK_EQ(list->count, 0);
  ums_dirlist_free(list);
  CHECK_RC(ums_fs_rmdir(sub, dl), 0);
  /* The file is unlinked but still open: it keeps working. */
  CHECK_EQ(ums_fs_read(fd, r, 0, 100, 0, dl), 100);
  CHECK_RC(ums_fs_close(fd, dl), 0);
  CHECK_EQ(ums_fs_read(fd, r, 0, 100, 0, dl), UMS_EBADF);

  ums_buf_release(w);
  ums_buf_release(r);
  ums_buf_release(a);
  ums_buf_release(b);
  ums_buf_release(c);
  ums_buf_release(back);
  ums_buf_release(back2);
  return PTR(1);
}

static void test_ops_task(void) { CHECK(tu_in_task(rt, 0, ops_suite, "task")); }
static void test_ops_other_sched(void) {
  CHECK(tu_in_task(rt, ums_runtime_schedulers(rt) - 1, ops_suite, "task2"));
}
static void test_ops_host(void) { CHECK(ops_suite("host")); }

/* ====================================================================== */
/* Whole files (ums_fs_readfile)                                           */
/* ====================================================================== */

static void put_file(const char *path, size_t n, uint8_t seed) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0);
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)(seed + i * 7);
    CHECK_EQ(write(fd, &c, 1), 1);
  }
  close(fd);
}

static void *readfile_suite(void *arg) {
  const char *tag = arg;
  char small[512], empty[512], exact[512], big[512], fifo[512], name[64];
  int64_t dl = UMS_FOREVER;
  snprintf(name, sizeof name, "rf-small-%s", tag);
  put_file(path_of(small, name), 100, 3);
  snprintf(name, sizeof name, "rf-empty-%s", tag);
  put_file(path_of(empty, name), 0, 0);
  snprintf(name, sizeof name, "rf-exact-%s", tag);
  put_file(path_of(exact, name), 4096, 5);
  snprintf(name, sizeof name, "rf-big-%s", tag);
  put_file(path_of(big, name), 4097, 9);
  char under[512], proc[64];
  snprintf(name, sizeof name, "rf-under-%s", tag);
  put_file(path_of(under, name), 4095, 4);
  snprintf(name, sizeof name, "rf-fifo-%s", tag);
  CHECK_EQ(mkfifo(path_of(fifo, name), 0600), 0);
  int before = tu_fd_count();
  ums_buf_t *b = ums_buf_new(4096);
  int fd = -7;

  CHECK_EQ(ums_fs_readfile(small, b, &fd, dl), 100);
  CHECK(same(b, 100, 3));
  CHECK_EQ(fd, -7); /* written only with UMS_ESPIPE */
  CHECK_EQ(ums_fs_readfile(empty, b, &fd, dl), 0);
  CHECK_EQ(ums_fs_readfile(exact, b, NULL, dl), 4096); /* fits exactly */
  CHECK(same(b, 4096, 5));
  CHECK_EQ(ums_fs_readfile(big, b, NULL, dl), UMS_EFBIG);
  CHECK_EQ(ums_fs_readfile(under, b, NULL, dl), 4095); /* one byte spare */
  CHECK(same(b, 4095, 4));
  /* procfs says size 0 and reads what it has: the whole of it, as a
  ** read(2) loop gets it (the process's limits do not change meanwhile) */
  snprintf(proc, sizeof proc, "/proc/%d/limits", (int)getpid());
  int pfd = open(proc, O_RDONLY);
  CHECK(pfd >= 0);
  char want[4096];
  size_t wn = 0;
  for (ssize_t k; (k = read(pfd, want + wn, sizeof want - wn)) > 0;)
    wn += (size_t)k;
  close(pfd);
  CHECK_GT(wn, 100);
  CHECK_EQ(ums_fs_readfile(proc, b, NULL, dl), (int64_t)wn);
  CHECK(memcmp(ums_buf_data(b), want, wn) == 0);
  char missing[512];
  path_of(missing, "no/such/file");
  CHECK_EQ(ums_fs_readfile(missing, b, &fd, dl), UMS_ENOENT);
  CHECK_EQ(ums_fs_readfile(dir, b, &fd, dl), UMS_EISDIR);
  CHECK_EQ(ums_fs_readfile(NULL, b, &fd, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_readfile(small, NULL, &fd, dl), UMS_EINVAL);
  CHECK_EQ(fd, -7);

  /* A FIFO cannot be read at an offset: nothing is taken from it, and it
  ** is handed over open. The holder is reader and writer, so no open
  ** waits. */
  int holder = open(fifo, O_RDWR);
  CHECK(holder >= 0);
  CHECK_EQ(write(holder, "abc", 3), 3);
  CHECK_EQ(ums_fs_readfile(fifo, b, &fd, dl), UMS_ESPIPE);
  CHECK(fd >= 0);
  CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  char got[4] = {0};
  CHECK_EQ(read(fd, got, 3), 3);
  CHECK(memcmp(got, "abc", 3) == 0);
  close(fd);
  /* Not taken (fd NULL, or ums_fs_end): closed by the runtime. */
  CHECK_EQ(ums_fs_readfile(fifo, b, NULL, dl), UMS_ESPIPE);
  if (ums_self()) {
    ums_fs_req_t *q = NULL;
    CHECK_RC(ums_fs_readfile_begin(small, b, dl, &q), 0);
    CHECK_RC(ums_park_wait(), 0);
    CHECK_EQ(ums_fs_readfile_end(q, &fd), 100);
    /* ums_fs_end closes the descriptor nobody takes */
    CHECK_RC(ums_fs_readfile_begin(fifo, b, dl, &q), 0);
    CHECK_RC(ums_park_wait(), 0);
    CHECK_EQ(ums_fs_end(q), UMS_ESPIPE);
    /* the end call of another kind refuses a readfile request */
    CHECK_RC(ums_fs_readfile_begin(small, b, dl, &q), 0);
    CHECK_RC(ums_park_wait(), 0);
    ums_stat_t st;
    CHECK_RC(ums_fs_stat_end(q, &st), UMS_EINVAL);
    CHECK_EQ(ums_fs_end(q), 100);
  } else {
    CHECK_RC(ums_fs_readfile_begin(small, b, dl, NULL), UMS_EINVAL);
  }
  CHECK_EQ(ums_fs_readfile_end(NULL, &fd), UMS_EINVAL);
  close(holder);
  CHECK_EQ(tu_fd_count(), before);
  ums_buf_release(b);
  unlink(fifo);
  return PTR(1);
}

static void test_readfile_task(void) {
  CHECK(tu_in_task(rt, 0, readfile_suite, "task"));
}
static void test_readfile_host(void) { CHECK(readfile_suite("host")); }

/* Many tasks read many small files at once (ring slots in use together,
** more of them than the pool's threads), each checked. */
#define RF_FILES 300
static void *readfile_many(void *arg) {
  int k = (int)(uintptr_t)arg;
  ums_buf_t *b = ums_buf_new(8192);
  for (int i = k; i < RF_FILES; i += 32) {
    char p[512], name[64];
    snprintf(name, sizeof name, "rf-many-%d", i);
    CHECK_EQ(ums_fs_readfile(path_of(p, name), b, NULL, UMS_FOREVER),
             i * 11);
    CHECK(same(b, (size_t)(i * 11), (uint8_t)i));
  }
  ums_buf_release(b);
  return PTR(1);
}

static void test_readfile_many(void) {
  for (int i = 0; i < RF_FILES; i++) {
    char p[512], name[64];
    snprintf(name, sizeof name, "rf-many-%d", i);
    put_file(path_of(p, name), (size_t)(i * 11), (uint8_t)i);
  }
  int before = tu_fd_count();
  ums_task_t t[32];
  for (int k = 0; k < 32; k++) {
    ums_spawn_opts_t o = {.sched = k % ums_runtime_schedulers(rt)};
    CHECK_RC(ums_task_spawn(rt, &o, readfile_many, PTR(k), &t[k]), 0);
  }
  for (int k = 0; k < 32; k++) {
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t[k], UMS_FOREVER, &res, NULL), 0);
    CHECK(res);
  }
  CHECK_EQ(tu_fd_count(), before);
}

/* ====================================================================== */
/* Bad input                                                               */
/* ====================================================================== */

static void *bad_input(void *arg) {
  (void)arg;
  char file[512], missing[512], sub[512];
  path_of(file, "bad.dat");
  path_of(missing, "no/such/file");
  path_of(sub, ums_self() ? "bad-dir-task" : "bad-dir-host");
  int64_t dl = UMS_FOREVER;
  ums_buf_t *b = ums_buf_new(4096);
  ums_stat_t st;
  ums_dirlist_t *list = (ums_dirlist_t *)PTR(1);

  CHECK_RC(ums_fs_open(missing, O_RDONLY, 0, dl), UMS_ENOENT);
  CHECK_RC(ums_fs_open(NULL, O_RDONLY, 0, dl), UMS_EINVAL);
  CHECK_RC(ums_fs_open(dir, O_WRONLY, 0, dl), UMS_EISDIR);
  CHECK_RC(ums_fs_open(dir, O_RDWR, 0, dl), UMS_EISDIR);
  CHECK_RC(ums_fs_stat(missing, 0, &st, dl), UMS_ENOENT);
  CHECK_RC(ums_fs_stat(file, 2, &st, dl), UMS_EINVAL);
  CHECK_RC(ums_fs_stat(file, 0, NULL, dl), UMS_EINVAL);
  CHECK_RC(ums_fs_unlink(missing, dl), UMS_ENOENT);
  CHECK_RC(ums_fs_rename(missing, file, dl), UMS_ENOENT);
  CHECK_RC(ums_fs_rename(file, NULL, dl), UMS_EINVAL);
  CHECK_RC(ums_fs_readdir(missing, &list, dl), UMS_ENOENT);
  CHECK_PTR_EQ(list, PTR(1)); /* untouched on failure */
  CHECK_RC(ums_fs_mkdir(missing, 0755, dl), UMS_ENOENT);
  char longname[5000];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  CHECK_RC(ums_fs_open(longname, O_RDONLY, 0, dl), UMS_ENAMETOOLONG);

  int fd = ums_fs_open(file, O_CREAT | O_RDWR | O_TRUNC, 0600, dl);
  CHECK_GE(fd, 0);
  CHECK_RC(ums_fs_readdir(file, &list, dl), UMS_ENOTDIR);
  fill(b, 4096, 9);
  CHECK_EQ(ums_fs_write(fd, b, 0, 100, 0, dl), 100);
  /* Rejected before anything is written. */
  CHECK_EQ(ums_fs_write(fd, b, 0, 100, -2, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_write(fd, b, 0, 100, INT64_MIN, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_write(fd, b, 0, 5000, 0, dl), UMS_EINVAL);      /* > buf */
  CHECK_EQ(ums_fs_write(fd, b, 4000, 97, 0, dl), UMS_EINVAL);     /* past */
  CHECK_EQ(ums_fs_write(fd, b, 5000, 0, 0, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_write(fd, b, SIZE_MAX, 2, 0, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_write(fd, NULL, 0, 1, 0, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_write(fd, b, 0, SIZE_MAX, 0, dl), UMS_EINVAL);  /* huge */
  CHECK_EQ(ums_fs_read(fd, b, 0, SIZE_MAX, 0, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_read(fd, b, 0, 10, -5, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_read(-1, b, 0, 10, 0, dl), UMS_EBADF);
  ums_iov_t v[2] = {{b, 0, 10}, {NULL, 0, 10}};
  CHECK_EQ(ums_fs_writev(fd, v, 2, 0, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_writev(fd, v, 0, 0, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_writev(fd, v, UMS_FS_IOV_MAX + 1, 0, dl), UMS_EINVAL);
  CHECK_EQ(ums_fs_readv(fd, NULL, 1, 0, dl), UMS_EINVAL);
  CHECK_RC(ums_fs_fsync(fd, 4, dl), UMS_EINVAL);
  ums_stat_t st2;
  CHECK_RC(ums_fs_fstat(fd, &st2, dl), 0);
  CHECK_EQ(st2.size, 100); /* nothing half-written */
  /* Reading a write-only descriptor, writing a read-only one. */
  int wo = ums_fs_open(file, O_WRONLY, 0, dl), ro = ums_fs_open(file, O_RDONLY, 0, dl);
  CHECK_GE(wo, 0);
  CHECK_GE(ro, 0);
  CHECK_EQ(ums_fs_read(wo, b, 0, 10, 0, dl), UMS_EBADF);
  CHECK_EQ(ums_fs_write(ro, b, 0, 10, 0, dl), UMS_EBADF);
  /* A huge offset: the kernel's answer, no crash. */
  int64_t r = ums_fs_write(fd, b, 0, 10, INT64_MAX - 5, dl);
  CHECK(r == UMS_EFBIG || r == UMS_EINVAL);
  r = ums_fs_read(fd, b, 0, 10, INT64_MAX - 5, dl);
  CHECK(r == 0 || r == UMS_EINVAL);
  CHECK_RC(ums_fs_close(wo, dl), 0);
  CHECK_RC(ums_fs_close(ro, dl), 0);
  CHECK_RC(ums_fs_close(fd, dl), 0);
  /* A closed descriptor. */
  CHECK_EQ(ums_fs_read(fd, b, 0, 10, 0, dl), UMS_EBADF);
  CHECK_EQ(ums_fs_write(fd, b, 0, 10, 0, dl), UMS_EBADF);
  CHECK_RC(ums_fs_fstat(fd, &st2, dl), UMS_EBADF);
  CHECK_RC(ums_fs_fsync(fd, 0, dl), UMS_EBADF);
  CHECK_RC(ums_fs_close(fd, dl), UMS_EBADF);
  CHECK_RC(ums_fs_close(-1, dl), UMS_EBADF);
  /* Directories. */
  CHECK_RC(ums_fs_mkdir(sub, 0700, dl), 0);
  CHECK_RC(ums_fs_unlink(sub, dl), UMS_EISDIR);
  CHECK_RC(ums_fs_rmdir(file, dl), UMS_ENOTDIR);
  CHECK_RC(ums_fs_rmdir(sub, dl), 0);
  CHECK_RC(ums_fs_unlink(file, dl), 0);
  ums_buf_release(b);
  return PTR(1);
}

static void test_bad_input(void) {
  CHECK(tu_in_task(rt, 0, bad_input, NULL));
  CHECK(bad_input(NULL));
  /* Buffers: bad sizes. */
  CHECK(ums_buf_new(0) == NULL);
  CHECK(ums_buf_new(SIZE_MAX) == NULL);
  ums_buf_release(NULL);
}

/* ====================================================================== */
/* Buffers                                                                 */
/* ====================================================================== */

static void *buf_cache(void *arg) {
  (void)arg;
  ums_buf_t *a = ums_buf_new(1 << 20);
  CHECK(a);
  CHECK_EQ((uintptr_t)ums_buf_data(a) % 4096, 0);
  CHECK_EQ(ums_buf_size(a), 1 << 20);
  void *data = ums_buf_data(a);
  ums_buf_release(a);
  /* A read loop's take-and-release does not allocate: the same buffer
  ** comes back from this scheduler's cache. */
  for (int i = 0; i < 100; i++) {
    ums_buf_t *b = ums_buf_new(1000000);
    CHECK_PTR_EQ(ums_buf_data(b), data);
    CHECK_EQ(ums_buf_size(b), 1000000);
    ums_buf_release(b);
  }
  /* References. */
  ums_buf_t *b = ums_buf_new(10);
  ums_buf_retain(b);
  ums_buf_release(b);
  memset(ums_buf_data(b), 1, 10); /* still alive */
  ums_buf_release(b);
  /* Odd sizes and sizes past the classes are page-aligned too. */
  size_t sizes[] = {1, 4095, 4097, 65537, (8u << 20) + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    ums_buf_t *c = ums_buf_new(sizes[i]);
    CHECK(c);
    CHECK_EQ((uintptr_t)ums_buf_data(c) % 4096, 0);
    memset(ums_buf_data(c), 0, sizes[i]);
    ums_buf_release(c);
  }
  return PTR(1);
}

/* Many smallest-class buffers taken at once (a server's burst of short
** receives): each its own page-aligned 4 KiB, none overlapping another;
** arg receives them for the caller to release elsewhere. */
enum { NSMALL = 200 };
static void *buf_small_burst(void *arg) {
  ums_buf_t **out = arg;
  for (int i = 0; i < NSMALL; i++) {
    out[i] = ums_buf_new(100);
    CHECK(out[i]);
    CHECK_EQ((uintptr_t)ums_buf_data(out[i]) % 4096, 0);
    memset(ums_buf_data(out[i]), i, 4096);
  }
  for (int i = 0; i < NSMALL; i++) {
    const unsigned char *d = ums_buf_data(out[i]);
    for (int k = 0; k < 4096; k++) CHECK_EQ(d[k], (unsigned char)i);
  }
  /* Half go back to this scheduler's cache and come out again. */
  for (int i = 0; i < NSMALL / 2; i++) ums_buf_release(out[i]);
  for (int i = 0; i < NSMALL / 2; i++) {
    out[i] = ums_buf_new(4096);
    memset(ums_buf_data(out[i]), 0xee, 4096);
  }
  return PTR(1);
}

static void test_buffers(void) {
  CHECK(tu_in_task(rt, 0, buf_cache, NULL));
  /* Released on a thread without a cache: each is freed, and the memory
  ** they were carved from with the last of them (ASan sees a miscount). */
  static ums_buf_t *small[NSMALL];
  CHECK(tu_in_task(rt, 0, buf_small_burst, small));
  for (int i = 0; i < NSMALL; i++) ums_buf_release(small[i]);
  /* On a host thread: aligned, no cache. */
  ums_buf_t *b = ums_buf_new(12345);
  CHECK_EQ((uintptr_t)ums_buf_data(b) % 4096, 0);
  ums_buf_release(b);
}

/* ====================================================================== */
/* A file larger than 4 GiB                                                */
/* ====================================================================== */

static void *big_offset(void *arg) {
  (void)arg;
  char file[512];
  path_of(file, "big.dat");
  const int64_t off = INT64_C(5) << 30;
  int fd = ums_fs_open(file, O_CREAT | O_RDWR | O_TRUNC, 0600, UMS_FOREVER);
  CHECK_GE(fd, 0);
  ums_buf_t *b = ums_buf_new(8192), *r = ums_buf_new(8192);
  fill(b, 8192, 77);
  CHECK_EQ(ums_fs_write(fd, b, 0, 8192, off, UMS_FOREVER), 8192);
  /* Also across the 4 GiB boundary, where a 32-bit offset would wrap. */
  CHECK_EQ(ums_fs_write(fd, b, 0, 8192, (INT64_C(4) << 30) - 4096,
                        UMS_FOREVER), 8192);
  ums_stat_t st;
  CHECK_RC(ums_fs_fstat(fd, &st, UMS_FOREVER), 0);
  CHECK_EQ(st.size, off + 8192);
  CHECK_LT(st.blocks * 512, INT64_C(1) << 24); /* sparse */
  CHECK_EQ(ums_fs_read(fd, r, 0, 8192, off, UMS_FOREVER), 8192);
  CHECK(same(r, 8192, 77));
  CHECK_EQ(ums_fs_read(fd, r, 0, 8192, (INT64_C(4) << 30) - 4096,
                       UMS_FOREVER), 8192);
  CHECK(same(r, 8192, 77));
  /* Low offsets (where a wrapped offset would land) hold zeros. */
  CHECK_EQ(ums_fs_read(fd, r, 0, 8192, 0, UMS_FOREVER), 8192);
  for (int i = 0; i < 8192; i++) CHECK_EQ(((uint8_t *)ums_buf_data(r))[i], 0);
  CHECK_EQ(ums_fs_read(fd, r, 0, 8192, off + 4096, UMS_FOREVER), 4096);
  /* Cross-check with the C library. */
  uint8_t c[16];
  CHECK_EQ(pread(fd, c, 16, off + 100), 16);
  CHECK(memcmp(c, (uint8_t *)ums_buf_data(b) + 100, 16) == 0);
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  CHECK_RC(ums_fs_unlink(file, UMS_FOREVER), 0);
  ums_buf_release(b);
  ums_buf_release(r);
  return PTR(1);
}

static void test_big_file(void) { CHECK(tu_in_task(rt, 0, big_offset, NULL)); }

/* ====================================================================== */
/* Short writes                                                            */
/* ====================================================================== */

/* A write that crosses RLIMIT_FSIZE (as on a full file system) writes
** what fits and returns that count; the next write, at the position the
** first one left, fails with EFBIG. On io_uring a short write at the file
** position leaves the position where it was, so the runtime must not let
** the next write start at 0 again (io.c, write_at_position). */

/* The room the test writes into: the file size limit in force when it
** is below 16 MiB (ctest runs test_io_shortwrite under `ulimit -f 1024`),
** else 1 MiB set here for the test's length; or, with --full-fs=<dir>
** (test_io_enospc: <dir> is a 1 MiB tmpfs), the free space of that file
** system. fsize_err is the error a write past it gets. */
static size_t fsize_limit;
static int64_t fsize_err = UMS_EFBIG;

/* The file at name holds exactly n bytes: the first n of the data
** written (fill's pattern with seed), in order. */
static void check_prefix(const char *name, size_t n, uint8_t seed) {
  int fd = open(name, O_RDONLY);
  CHECK_GE(fd, 0);
  struct stat st;
  CHECK_EQ(fstat(fd, &st), 0);
  CHECK_EQ((size_t)st.st_size, n);
  uint8_t *p = malloc(n + 1);
  CHECK(p != NULL);
  size_t got = 0;
  for (ssize_t k; got < n && (k = read(fd, p + got, n + 1 - got)) > 0;)
    got += (size_t)k;
  CHECK_EQ(got, n);
  for (size_t i = 0; i < n; i++)
    if (p[i] != (uint8_t)(seed + i * 7)) {
      fprintf(stderr, "byte %zu differs\n", i);
      CHECK(0);
    }
  free(p);
  close(fd);
}

static int open_trunc(const char *name) {
  int fd = ums_fs_open(name, O_CREAT | O_WRONLY | O_TRUNC, 0600,
                       UMS_FOREVER);
  CHECK_GE(fd, 0);
  return fd;
}

static void *short_write_suite(void *arg) {
  const char *where = arg;
  size_t lim = fsize_limit;
  char name[512], nm[64];
  snprintf(nm, sizeof nm, "short-%s", where);
  path_of(name, nm);
  ums_buf_t *b = ums_buf_new(2 * lim);
  fill(b, 2 * lim, 31);

  /* At the file position: one write twice the limit, then the rest. */
  int fd = open_trunc(name);
  CHECK_EQ(ums_fs_write(fd, b, 0, 2 * lim, UMS_FS_CUR, UMS_FOREVER),
           (int64_t)lim);
  CHECK_EQ(lseek(fd, 0, SEEK_CUR), (off_t)lim);
  CHECK_EQ(ums_fs_write(fd, b, lim, lim, UMS_FS_CUR, UMS_FOREVER),
           fsize_err);
  CHECK_EQ(ums_fs_write(fd, b, lim, lim, UMS_FS_CUR, UMS_FOREVER),
           fsize_err);
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  check_prefix(name, lim, 31);

  /* At the file position, in pieces of 2/5 of the limit: two whole, one
  ** short, then the error. */
  size_t piece = lim / 5 * 2, at = 0;
  fd = open_trunc(name);
  for (int i = 0; i < 2; i++, at += piece)
    CHECK_EQ(ums_fs_write(fd, b, at, piece, UMS_FS_CUR, UMS_FOREVER),
             (int64_t)piece);
  CHECK_EQ(ums_fs_write(fd, b, at, piece, UMS_FS_CUR, UMS_FOREVER),
           (int64_t)(lim - at));
  at = lim;
  CHECK_EQ(ums_fs_write(fd, b, at, piece, UMS_FS_CUR, UMS_FOREVER),
           fsize_err);
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  check_prefix(name, lim, 31);

  /* Gathered, at the file position. */
  ums_iov_t v[2] = {{b, 0, lim}, {b, lim, lim}};
  fd = open_trunc(name);
  CHECK_EQ(ums_fs_writev(fd, v, 2, UMS_FS_CUR, UMS_FOREVER), (int64_t)lim);
  CHECK_EQ(ums_fs_writev(fd, &v[1], 1, UMS_FS_CUR, UMS_FOREVER), fsize_err);
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  check_prefix(name, lim, 31);

  /* The deferred form, in a task: the same requests. */
  if (ums_self() != 0) {
    ums_fs_req_t *q;
    fd = open_trunc(name);
    CHECK_RC(ums_fs_write_begin(fd, b, 0, 2 * lim, UMS_FS_CUR, UMS_FOREVER,
                                &q), 0);
    ums_park_wait();
    CHECK_EQ(ums_fs_end(q), (int64_t)lim);
    CHECK_RC(ums_fs_write_begin(fd, b, lim, lim, UMS_FS_CUR, UMS_FOREVER,
                                &q), 0);
    ums_park_wait();
    CHECK_EQ(ums_fs_end(q), fsize_err);
    CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
    check_prefix(name, lim, 31);
  }

  /* At explicit offsets, as a caller that keeps its own position. */
  fd = open_trunc(name);
  CHECK_EQ(ums_fs_write(fd, b, 0, 2 * lim, 0, UMS_FOREVER), (int64_t)lim);
  CHECK_EQ(ums_fs_write(fd, b, lim, lim, (int64_t)lim, UMS_FOREVER),
           fsize_err);
  CHECK_EQ(ums_fs_writev(fd, &v[1], 1, (int64_t)lim, UMS_FOREVER),
           fsize_err);
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  check_prefix(name, lim, 31);

  /* Appending: the short write, then the error. */
  fd = ums_fs_open(name, O_CREAT | O_WRONLY | O_TRUNC | O_APPEND, 0600,
                   UMS_FOREVER);
  CHECK_GE(fd, 0);
  CHECK_EQ(ums_fs_write(fd, b, 0, 2 * lim, UMS_FS_CUR, UMS_FOREVER),
           (int64_t)lim);
  CHECK_EQ(ums_fs_write(fd, b, lim, lim, UMS_FS_CUR, UMS_FOREVER),
           fsize_err);
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  check_prefix(name, lim, 31);

  CHECK_RC(ums_fs_unlink(name, UMS_FOREVER), 0);
  ums_buf_release(b);
  return PTR(1);
}

/* A write filling the file system (ENOSPC): the test's directory is on a
** tmpfs of 1 MiB. */
static void test_full_fs(void) {
  fsize_limit = (size_t)1 << 20;
  fsize_err = UMS_ENOSPC;
  CHECK(tu_in_task(rt, 0, short_write_suite, "task"));
  CHECK(short_write_suite("host"));
}

static void test_short_write(void) {
  struct rlimit old;
  CHECK_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  bool set_here = old.rlim_cur == RLIM_INFINITY ||
                  old.rlim_cur > ((rlim_t)16 << 20);
  struct sigaction ign = {.sa_handler = SIG_IGN}, old_act;
  CHECK_EQ(sigaction(SIGXFSZ, &ign, &old_act), 0);
  if (set_here) {
    struct rlimit lim = {(rlim_t)1 << 20, old.rlim_max};
    CHECK_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  fsize_limit = set_here ? (size_t)1 << 20 : (size_t)old.rlim_cur;
  printf("   file size limit: %zu bytes%s\n", fsize_limit,
         set_here ? " (set here)" : "");
  CHECK(tu_in_task(rt, 0, short_write_suite, "task"));
  CHECK(short_write_suite("host"));
  if (set_here) CHECK_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  CHECK_EQ(sigaction(SIGXFSZ, &old_act, NULL), 0);
}

/* ====================================================================== */
/* Reading while another task writes                                       */
/* ====================================================================== */

#define RW_BLOCK 65536
#define RW_BLOCKS 64

typedef struct rw_share {
  int fd;
  _Atomic int written; /* blocks the writer has finished */
} rw_share_t;

static void *rw_writer(void *arg) {
  rw_share_t *sh = arg;
  ums_buf_t *b = ums_buf_new(RW_BLOCK);
  for (int i = 0; i < RW_BLOCKS; i++) {
    memset(ums_buf_data(b), i + 1, RW_BLOCK);
    CHECK_EQ(ums_fs_write(sh->fd, b, 0, RW_BLOCK, (int64_t)i * RW_BLOCK,
                          UMS_FOREVER),
             RW_BLOCK);
    atomic_store(&sh->written, i + 1);
    if (i % 4 == 0) ums_yield();
  }
  ums_buf_release(b);
  return PTR(1);
}

/* Each byte read is either not written yet (0, or past the end) or the
** writer's value for its block; every block written before a read began
** is read whole. */
static void *rw_reader(void *arg) {
  rw_share_t *sh = arg;
  ums_buf_t *b = ums_buf_new(RW_BLOCK);
  int complete = 0;
  while (complete < RW_BLOCKS) {
    int done_before = atomic_load(&sh->written);
    for (int i = complete; i < RW_BLOCKS; i++) {
      int64_t n = ums_fs_read(sh->fd, b, 0, RW_BLOCK, (int64_t)i * RW_BLOCK,
                              UMS_FOREVER);
      CHECK_GE(n, 0);
      const uint8_t *p = ums_buf_data(b);
      bool whole = n == RW_BLOCK;
      for (int64_t k = 0; k < n; k++) {
        CHECK(p[k] == 0 || p[k] == i + 1);
        if (p[k] != i + 1) whole = false;
      }
      if (i < done_before) CHECK(whole);
      if (whole && i == complete) complete++;
    }
    ums_yield();
  }
  ums_buf_release(b);
  return PTR(1);
}

static void test_read_while_write(void) {
  char file[512];
  path_of(file, "rw.dat");
  rw_share_t sh = {.fd = open(file, O_CREAT | O_RDWR | O_TRUNC, 0600)};
  CHECK_GE(sh.fd, 0);
  /* Same scheduler, then two schedulers (true parallelism). */
  for (int round = 0; round < 2; round++) {
    CHECK_EQ(ftruncate(sh.fd, 0), 0);
    atomic_store(&sh.written, 0);
    int other = round ? ums_runtime_schedulers(rt) - 1 : 0;
    ums_spawn_opts_t ow = {.sched = 0}, orr = {.sched = other};
    ums_task_t tw, tr;
    CHECK_RC(ums_task_spawn(rt, &orr, rw_reader, &sh, &tr), 0);
    CHECK_RC(ums_task_spawn(rt, &ow, rw_writer, &sh, &tw), 0);
    void *a = NULL, *b = NULL;
    CHECK_RC(ums_task_join(rt, tw, UMS_FOREVER, &a, NULL), 0);
    CHECK_RC(ums_task_join(rt, tr, UMS_FOREVER, &b, NULL), 0);
    CHECK(a && b);
  }
  close(sh.fd);
  unlink(file);
}

/* ====================================================================== */
/* Many tasks at once                                                      */
/* ====================================================================== */

#define MANY 64

static void *many_files(void *arg) {
  int i = (int)(uintptr_t)arg;
  char file[512], name[64];
  snprintf(name, sizeof name, "many-%d", i);
  path_of(file, name);
  ums_buf_t *b = ums_buf_new(4096 + (size_t)i);
  for (int round = 0; round < 5; round++) {
    int fd = ums_fs_open(file, O_CREAT | O_RDWR | O_TRUNC, 0600, UMS_FOREVER);
    CHECK_GE(fd, 0);
    fill(b, 4096 + (size_t)i, (uint8_t)(i + round));
    CHECK_EQ(ums_fs_write(fd, b, 0, 4096 + (size_t)i, 0, UMS_FOREVER),
             4096 + i);
    memset(ums_buf_data(b), 0, 4096 + (size_t)i);
    CHECK_EQ(ums_fs_read(fd, b, 0, 4096 + (size_t)i, 0, UMS_FOREVER),
             4096 + i);
    CHECK(same(b, 4096 + (size_t)i, (uint8_t)(i + round)));
    CHECK_RC(ums_fs_close(fd, UMS_FOREVER), 0);
  }
  CHECK_RC(ums_fs_unlink(file, UMS_FOREVER), 0);
  ums_buf_release(b);
  return PTR(1);
}

static void test_many_tasks(void) {
  ums_sched_stats_t before = tu_stats(rt, 0);
  ums_task_t t[MANY];
  for (int i = 0; i < MANY; i++) {
    ums_spawn_opts_t o = {.sched = i % ums_runtime_schedulers(rt)};
    CHECK_RC(ums_task_spawn(rt, &o, many_files, PTR(i), &t[i]), 0);
  }
  for (int i = 0; i < MANY; i++) {
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t[i], UMS_FOREVER, &res, NULL), 0);
    CHECK(res);
  }
  ums_sched_stats_t after = tu_stats(rt, 0);
  uint64_t reqs = after.io_requests - before.io_requests;
  uint64_t subs = after.io_submits - before.io_submits;
  printf("   scheduler 0: %" PRIu64 " requests, %" PRIu64 " ring submits\n",
         reqs, subs);
  CHECK_GE(reqs, (uint64_t)(MANY / ums_runtime_schedulers(rt)) * 21);
  ums_config_t c;
  ums_runtime_config(rt, &c);
  if (c.io_backend == UMS_IO_URING)
    /* Batched: tasks queued behind one another share system calls. */
    CHECK_LT(subs, reqs);
  else
    CHECK_EQ(subs, 0);
  WAIT_UNTIL(io_pending() == 0, 5000);
}

/* ====================================================================== */
/* Timeouts and cancellation with a request in flight                      */
/* ====================================================================== */

/* A read from a pipe that nobody writes to stays in flight: in the ring
** it waits for data, on the pool it blocks a thread. */
typedef struct pipe_read {
  int fd;
  int64_t timeout;       /* ns; -1: none */
  bool followup;         /* after a timeout, more I/O must work */
  _Atomic int started;
  int64_t result;
  int64_t elapsed;
} pipe_read_t;

static void *pipe_reader(void *arg) {
  pipe_read_t *p = arg;
  ums_buf_t *b = ums_buf_new(65536);
  atomic_store(&p->started, 1);
  int64_t t0 = ums_now();
  p->result = ums_fs_read(p->fd, b, 0, 65536, UMS_FS_CUR,
                          p->timeout < 0 ? UMS_FOREVER : ums_deadline(p->timeout));
  p->elapsed = ums_now() - t0;
  /* The caller's reference goes now; the request keeps its own until the
  ** kernel (or the pool thread) is done with the buffer. */
  ums_buf_release(b);
  /* The task goes on doing I/O after giving up on one request. */
  if (p->followup && p->result == UMS_ETIMEDOUT) {
    ums_stat_t st;
    CHECK_RC(ums_fs_fstat(p->fd, &st, UMS_FOREVER), 0);
    CHECK(S_ISFIFO(st.mode));
  }
  return PTR(1);
}

static void test_timeout_in_flight(void) {
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  pipe_read_t p = {.fd = fds[0], .timeout = tu_ms(50), .followup = true};
  CHECK(tu_in_task(rt, 0, pipe_reader, &p));
  CHECK_RC((int)p.result, UMS_ETIMEDOUT);
  CHECK_GE(p.elapsed, tu_ms(50));
  CHECK_LT(p.elapsed, tu_ms(5000));
  /* The abandoned read ends (cancelled in the kernel, or interrupted on
  ** the pool); data written now must not crash anything either way. */
  CHECK_EQ(write(fds[1], "hello", 5), 5);
  WAIT_UNTIL(io_pending() == 0, 5000);
  close_late(fds[0]);
  close_late(fds[1]);
}

/* The I/O pool starts a thread per CPU and grows only for threads blocked
** in their work. Pool backend only (the ring waits for a pipe in the
** kernel). Eight reads of empty pipes block eight threads: the pipe read
** last must still be served, which takes the pool growing past its
** first threads (without growth it would wait behind reads that never
** end, and the join's deadline fails it). Then many reads of a cached
** file, which never block, leave the pool as it was. */
#define GROW_PIPES 8
static uint64_t io_threads(void) {
  ums_pool_stats_t rows[2];
  int n = ums_runtime_pool_stats(rt, rows, 2);
  for (int i = 0; i < n && i < 2; i++)
    if (strcmp(rows[i].name, "io") == 0) return rows[i].threads;
  CHECK(!"no io pool row");
  return 0;
}

static void *cached_reads(void *arg) {
  const char *path = arg;
  ums_buf_t *b = ums_buf_new(4096);
  for (int i = 0; i < 2000; i++) {
    int64_t fd = ums_fs_open(path, O_RDONLY, 0, UMS_FOREVER);
    CHECK_GE(fd, 0);
    CHECK_EQ(ums_fs_read((int)fd, b, 0, 4096, 0, UMS_FOREVER), 5);
    CHECK_RC(ums_fs_close((int)fd, UMS_FOREVER), 0);
  }
  ums_buf_release(b);
  return PTR(1);
}

static void test_pool_growth(void) {
  ums_config_t c;
  ums_runtime_config(rt, &c);
  if (c.io_backend != UMS_IO_POOL) {
    printf("   (pool backend only)\n");
    return;
  }
  int fds[GROW_PIPES][2];
  pipe_read_t p[GROW_PIPES];
  ums_task_t t[GROW_PIPES];
  for (int i = 0; i < GROW_PIPES; i++) {
    CHECK_EQ(pipe(fds[i]), 0);
    p[i] = (pipe_read_t){.fd = fds[i][0], .timeout = -1};
    ums_spawn_opts_t o = {.sched = 0};
    CHECK_RC(ums_task_spawn(rt, &o, pipe_reader, &p[i], &t[i]), 0);
  }
  WAIT_UNTIL(io_pending() == GROW_PIPES, 5000);
  /* Answered in reverse: the last read is the one queued longest. */
  for (int i = GROW_PIPES - 1; i >= 0; i--) {
    CHECK_EQ(write(fds[i][1], "x", 1), 1);
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t[i], ums_deadline(tu_ms(10000)), &res, NULL),
             0);
    CHECK_EQ(p[i].result, 1);
  }
  uint64_t grown = io_threads();
  printf("   %" PRIu64 " I/O pool threads after %d blocked reads\n", grown,
         GROW_PIPES);
  CHECK_GE(grown, (uint64_t)GROW_PIPES);
  for (int i = 0; i < GROW_PIPES; i++) {
    close(fds[i][0]);
    close(fds[i][1]);
  }
  WAIT_UNTIL(io_pending() == 0, 5000);

  /* A fresh runtime: cached reads from 16 tasks do not grow its pool
  ** beyond a thread per CPU (they never block in the kernel). */
  ums_runtime_t *saved = rt;
  rt = tu_runtime_new(1);
  char path[512];
  path_of(path, "growth-cached");
  int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
  CHECK_GE(fd, 0);
  CHECK_EQ(write(fd, "hello", 5), 5);
  close(fd);
  enum { READERS = 16 };
  ums_task_t r[READERS];
  for (int i = 0; i < READERS; i++) {
    ums_spawn_opts_t o = {.sched = 0};
    CHECK_RC(ums_task_spawn(rt, &o, cached_reads, path, &r[i]), 0);
  }
  for (int i = 0; i < READERS; i++)
    CHECK_RC(ums_task_join(rt, r[i], UMS_FOREVER, NULL, NULL), 0);
  uint64_t cached = io_threads();
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  printf("   %" PRIu64 " I/O pool threads after 32,000 cached reads "
         "(%ld CPUs)\n", cached, cpus);
  /* A thread or two more may start when one is descheduled inside a
  ** kernel lock on a crowded machine; a pool grown at once to its bound
  ** (64) is what this catches. */
  uint64_t bound = (uint64_t)(cpus > 0 ? cpus : 1) * 4;
#ifdef TU_TSAN
  /* Under TSan the pool threads do block, in TSan's own runtime: caught
  ** at two looks in a row in futex waits inside libtsan (its internal
  ** locks and global resets stop every thread; seen with three TSan runs
  ** of this test at once on 2 CPUs: 10-14 threads, each start answering
  ** such a wait), which the growth rule rightly counts as blocked. The
  ** tight bound is checked by the normal and ASan builds; here only that
  ** the pool stays well short of its bound. */
  ums_config_t now;
  ums_runtime_config(rt, &now);
  bound = (uint64_t)now.io_pool_threads / 2;
#endif
  CHECK_LE(cached, bound);
  tu_runtime_shutdown(rt);
  rt = saved;
}

static void test_cancel_in_flight(void) {
  int fds[2], lost = 0;
  CHECK_EQ(pipe(fds), 0);
  for (int round = 0; round < 20; round++) {
    pipe_read_t p = {.fd = fds[0], .timeout = -1};
    ums_spawn_opts_t o = {.sched = round % ums_runtime_schedulers(rt)};
    ums_task_t t;
    CHECK_RC(ums_task_spawn(rt, &o, pipe_reader, &p, &t), 0);
    WAIT_UNTIL(atomic_load(&p.started) && io_pending() == 1, 5000);
    if (round % 2) usleep(1000);
    CHECK_RC(ums_task_cancel(rt, t), 0);
    void *res = NULL;
    int status = 1;
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, &status), 0);
    CHECK(res);
    CHECK_RC((int)p.result, UMS_ECANCELED);
    if (settle_abandoned_read(fds[1])) lost++;
  }
  if (lost) printf("   %d of 20 pool interrupts lost (read ended by data)\n", lost);
  ums_config_t c;
  ums_runtime_config(rt, &c);
  if (c.io_backend == UMS_IO_URING) CHECK_EQ(lost, 0);
  /* Nothing consumed the pipe: the cancelled reads really ended. */
  CHECK_EQ(write(fds[1], "x", 1), 1);
  char ch;
  CHECK_EQ(read(fds[0], &ch, 1), 1);
  CHECK_EQ(ch, 'x');
  close_late(fds[0]);
  close_late(fds[1]);
}

/* A task that is already cancelled may not wait, but its close must still
** close the descriptor (ums.h: "closed all the same"). */
static void *close_when_cancelled(void *arg) {
  int fd = *(int *)arg;
  CHECK_RC(ums_task_cancel(rt, ums_self()), 0);
  CHECK(ums_cancelled());
  CHECK_RC(ums_fs_close(fd, UMS_FOREVER), UMS_ECANCELED);
  return PTR(1);
}

static void test_close_cancelled(void) {
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  CHECK(tu_in_task(rt, 0, close_when_cancelled, &fds[0]) == PTR(1));
  errno = 0;
  CHECK_EQ(fcntl(fds[0], F_GETFD), -1);
  CHECK_EQ(errno, EBADF);
  close(fds[1]);
}

/* open(2) of a FIFO blocks until a writer comes. Abandon such an open,
** then let a writer come: if the open completes after all, the runtime
** closes the descriptor nobody will take. (io_uring's OPENAT does not wait
** for a writer: it opens the FIFO at once, see docs/design/io.md; then there
** is nothing to abandon.) */
static void *fifo_opener(void *arg) {
  const char *path = arg;
  int r = ums_fs_open(path, O_RDONLY, 0, ums_deadline(tu_ms(30)));
  if (r >= 0) {
    ums_config_t c;
    ums_runtime_config(rt, &c);
    CHECK_EQ(c.io_backend, UMS_IO_URING);
    CHECK_RC(ums_fs_close(r, UMS_FOREVER), 0);
    return PTR(2);
  }
  CHECK_RC(r, UMS_ETIMEDOUT);
  return PTR(1);
}

static void test_open_abandoned(void) {
  char fifo[512];
  path_of(fifo, "fifo");
  CHECK_EQ(mkfifo(fifo, 0600), 0);
  int before = tu_fd_count();
  for (int i = 0; i < 10; i++) {
    void *how = tu_in_task(rt, 0, fifo_opener, fifo);
    CHECK(how);
    /* ENXIO when no reader is left (the open was interrupted); otherwise
    ** our writer lets the abandoned open complete. */
    int w = open(fifo, O_WRONLY | O_NONBLOCK);
    if (w >= 0) close(w);
    WAIT_UNTIL(io_pending() == 0, 5000);
    WAIT_UNTIL(tu_fd_count() == before, 5000);
  }
  unlink(fifo);
}

/* Shutdown with requests still blocked: every task is cancelled at the
** deadline, and the runtime must end what the kernel or the pool still
** holds before it frees anything. */
static void test_shutdown_in_flight(void) {
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  ums_runtime_t *r2 = tu_runtime_new(2);
  ums_runtime_t *saved = rt;
  rt = r2;
  pipe_read_t p[4];
  for (int i = 0; i < 4; i++) {
    p[i] = (pipe_read_t){.fd = fds[0], .timeout = i < 2 ? -1 : tu_ms(1)};
    ums_spawn_opts_t o = {.sched = i % 2, .detached = 1};
    CHECK_RC(ums_task_spawn(r2, &o, pipe_reader, &p[i], NULL), 0);
  }
  WAIT_UNTIL(atomic_load(&p[0].started) && atomic_load(&p[1].started), 5000);
  rt = saved;
  int rc = ums_runtime_shutdown(r2, ums_deadline(tu_ms(100)));
  CHECK_RC(rc, UMS_ETIMEDOUT);
  tu_live_runtimes--;
  close(fds[0]);
  close(fds[1]);
}

/* ====================================================================== */
/* The deferred form: ums_fs_*_begin, then ums_fs_end after the park       */
/* ====================================================================== */

/* A C task ends the park a _begin call began with ums_park_wait; a step
** task (below) returns UMS_STEP_PARK instead. Evaluates to the end's
** result. */
#define DEFER(q, begin_call)                                               \
  __extension__({                                                          \
    ums_fs_req_t *q = NULL;                                                \
    int brc_ = (begin_call);                                               \
    if (brc_ != 0 || !q)                                                   \
      tu_fail(__FILE__, __LINE__, "%s: %s", #begin_call,                   \
              ums_err_name(brc_));                                         \
    int wrc_ = ums_park_wait();                                            \
    if (wrc_ != 0)                                                         \
      tu_fail(__FILE__, __LINE__, "ums_park_wait: %s", ums_err_name(wrc_));\
    ums_fs_end(q);                                                         \
  })

/* Every call in its deferred form, checked against the file system. */
static void *deferred_suite(void *arg) {
  const char *tag = arg;
  char sub[512], file[600], file2[600], tmp[100];
  snprintf(tmp, sizeof tmp, "defer-%s", tag);
  path_of(sub, tmp);
  snprintf(file, sizeof file, "%s/a.dat", sub);
  snprintf(file2, sizeof file2, "%s/b.dat", sub);
  int64_t dl = ums_deadline(10 * UMS_NSEC_PER_SEC);

  CHECK_RC((int)DEFER(q, ums_fs_mkdir_begin(sub, 0755, dl, &q)), 0);
  CHECK_RC((int)DEFER(q, ums_fs_mkdir_begin(sub, 0755, dl, &q)), UMS_EEXIST);
  int fd = (int)DEFER(q, ums_fs_open_begin(file, O_CREAT | O_RDWR | O_TRUNC,
                                           0644, dl, &q));
  CHECK_GE(fd, 0);
  CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);

  ums_buf_t *w = ums_buf_new(70000), *r = ums_buf_new(70000);
  fill(w, 70000, 5);
  CHECK_EQ(DEFER(q, ums_fs_write_begin(fd, w, 0, 70000, 0, dl, &q)), 70000);
  memset(ums_buf_data(r), 0, 70000);
  CHECK_EQ(DEFER(q, ums_fs_read_begin(fd, r, 0, 70000, 0, dl, &q)), 70000);
  CHECK(same(r, 70000, 5));
  /* UMS_FS_CUR moves the file position. */
  CHECK_EQ(lseek(fd, 0, SEEK_SET), 0);
  CHECK_EQ(DEFER(q, ums_fs_read_begin(fd, r, 0, 100, UMS_FS_CUR, dl, &q)),
           100);
  CHECK_EQ(lseek(fd, 0, SEEK_CUR), 100);
  CHECK_EQ(DEFER(q, ums_fs_read_begin(fd, r, 0, 10, 80000, dl, &q)), 0);

  ums_buf_t *a = ums_buf_new(10), *b = ums_buf_new(20);
  fill(a, 10, 1);
  fill(b, 20, 2);
  ums_iov_t out[2] = {{a, 0, 10}, {b, 5, 15}};
  CHECK_EQ(DEFER(q, ums_fs_writev_begin(fd, out, 2, 100000, dl, &q)), 25);
  ums_buf_t *back = ums_buf_new(25);
  ums_iov_t in[1] = {{back, 0, 25}};
  CHECK_EQ(DEFER(q, ums_fs_readv_begin(fd, in, 1, 100000, dl, &q)), 25);
  CHECK(memcmp(ums_buf_data(back), ums_buf_data(a), 10) == 0);
  CHECK(memcmp((char *)ums_buf_data(back) + 10, (char *)ums_buf_data(b) + 5,
               15) == 0);
  CHECK_RC((int)DEFER(q, ums_fs_fsync_begin(fd, 0, dl, &q)), 0);
  CHECK_RC((int)DEFER(q, ums_fs_fsync_begin(fd, UMS_FS_DATASYNC, dl, &q)),
           0);

  /* stat and fstat take their result with ums_fs_stat_end. */
  ums_stat_t st, st2;
  ums_fs_req_t *sq = NULL;
  CHECK_RC(ums_fs_fstat_begin(fd, dl, &sq), 0);
  CHECK_RC(ums_park_wait(), 0);
  CHECK_RC(ums_fs_stat_end(sq, &st), 0);
  CHECK_EQ(st.size, 100025);
  CHECK(S_ISREG(st.mode));
  CHECK_RC(ums_fs_stat_begin(file, 0, dl, &sq), 0);
  CHECK_RC(ums_park_wait(), 0);
  CHECK_RC(ums_fs_stat_end(sq, &st2), 0);
  CHECK_EQ(st2.ino, st.ino);
  struct stat ref;
  CHECK_EQ(stat(file, &ref), 0);
  CHECK_EQ(st2.ino, ref.st_ino);
  CHECK_EQ(st2.size, ref.st_size);
  /* ums_fs_end on a stat request: the result alone. */
  CHECK_RC((int)DEFER(q, ums_fs_stat_begin(file, 0, dl, &q)), 0);
  st2.size = 12345;
  CHECK_RC(ums_fs_stat_begin(file2, 0, dl, &sq), 0);
  CHECK_RC(ums_park_wait(), 0);
  CHECK_RC(ums_fs_stat_end(sq, &st2), UMS_ENOENT);
  CHECK_EQ(st2.size, 12345);  /* untouched on failure */

  /* rename, readdir */
  CHECK_RC((int)DEFER(q, ums_fs_rename_begin(file, file2, dl, &q)), 0);
  ums_dirlist_t *list = (ums_dirlist_t *)PTR(1);
  CHECK_RC(ums_fs_readdir_begin(file, dl, &sq), 0);
  CHECK_RC(ums_park_wait(), 0);
  CHECK_RC(ums_fs_readdir_end(sq, &list), UMS_ENOENT);
  CHECK_PTR_EQ(list, PTR(1));
  CHECK_RC(ums_fs_readdir_begin(sub, dl, &sq), 0);
  CHECK_RC(ums_park_wait(), 0);
  CHECK_RC(ums_fs_readdir_end(sq, &list), 0);
  CHECK_EQ(list->count, 1);
  CHECK_STR_EQ(list->entries[0].name, "b.dat");
  ums_dirlist_free(list);
  /* ums_fs_end on a readdir request frees the list with the request. */
  CHECK_RC((int)DEFER(q, ums_fs_readdir_begin(sub, dl, &q)), 0);

  /* unlink, rmdir, close */
  CHECK_RC((int)DEFER(q, ums_fs_rmdir_begin(sub, dl, &q)), UMS_ENOTEMPTY);
  CHECK_RC((int)DEFER(q, ums_fs_unlink_begin(file2, dl, &q)), 0);
  CHECK_RC((int)DEFER(q, ums_fs_unlink_begin(file2, dl, &q)), UMS_ENOENT);
  CHECK_RC((int)DEFER(q, ums_fs_rmdir_begin(sub, dl, &q)), 0);
  CHECK_RC((int)DEFER(q, ums_fs_close_begin(fd, dl, &q)), 0);
  CHECK_RC((int)DEFER(q, ums_fs_close_begin(fd, dl, &q)), UMS_EBADF);

  ums_buf_release(w);
  ums_buf_release(r);
  ums_buf_release(a);
  ums_buf_release(b);
  ums_buf_release(back);
  return PTR(1);
}

static void test_deferred_ops(void) {
  CHECK(tu_in_task(rt, 0, deferred_suite, "s0"));
  CHECK(tu_in_task(rt, ums_runtime_schedulers(rt) - 1, deferred_suite, "s1"));
}

/* Misuse is refused with a clear code, and a refused end leaves the
** request alone. */
static void *other_task_end(void *arg) {
  CHECK_EQ(ums_fs_end(arg), UMS_EPERM);
  return PTR(1);
}

static void *deferred_misuse(void *arg) {
  (void)arg;
  char file[512];
  path_of(file, "misuse.dat");
  int fd = open(file, O_CREAT | O_RDWR | O_TRUNC, 0600);
  CHECK_GE(fd, 0);
  int p[2];
  CHECK_EQ(pipe(p), 0);
  ums_buf_t *b = ums_buf_new(64);
  ums_fs_req_t *q = NULL;
  ums_stat_t st;
  ums_dirlist_t *list;

  /* Argument errors: nothing starts, *req stays as it was. */
  CHECK_RC(ums_fs_read_begin(-1, b, 0, 1, 0, UMS_FOREVER, &q), UMS_EBADF);
  CHECK_RC(ums_fs_read_begin(fd, NULL, 0, 1, 0, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK_RC(ums_fs_read_begin(fd, b, 60, 10, 0, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK_RC(ums_fs_read_begin(fd, b, 0, 1, -7, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK_RC(ums_fs_read_begin(fd, b, 0, 1, 0, UMS_FOREVER, NULL), UMS_EINVAL);
  CHECK_RC(ums_fs_open_begin(NULL, O_RDONLY, 0, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK_RC(ums_fs_stat_begin(file, 9, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK_RC(ums_fs_fstat_begin(-3, UMS_FOREVER, &q), UMS_EBADF);
  CHECK_RC(ums_fs_fsync_begin(fd, 8, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK_RC(ums_fs_rename_begin(file, NULL, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK_RC(ums_fs_close_begin(-1, UMS_FOREVER, &q), UMS_EBADF);
  CHECK_RC(ums_fs_writev_begin(fd, NULL, 1, 0, UMS_FOREVER, &q), UMS_EINVAL);
  CHECK(q == NULL);
  CHECK_EQ(ums_fs_end(NULL), UMS_EINVAL);
  CHECK_RC(ums_fs_stat_end(NULL, &st), UMS_EINVAL);
  CHECK_RC(ums_fs_readdir_end(NULL, &list), UMS_EINVAL);

  /* A park the task began itself is in the way. */
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin(UMS_FOREVER, &tok), 0);
  CHECK_RC(ums_fs_read_begin(fd, b, 0, 1, 0, UMS_FOREVER, &q), UMS_EBUSY);
  CHECK(q == NULL);
  CHECK_RC(ums_unpark(rt, tok, 7), 0);
  CHECK_EQ(ums_park_wait(), 7);

  /* Ending before the park has ended: refused, the request untouched. */
  CHECK_RC(ums_fs_read_begin(p[0], b, 0, 64, UMS_FS_CUR, UMS_FOREVER, &q), 0);
  CHECK_EQ(ums_fs_end(q), UMS_EBUSY);
  CHECK_RC(ums_fs_stat_end(q, &st), UMS_EINVAL);      /* not a stat */
  CHECK_RC(ums_fs_readdir_end(q, &list), UMS_EINVAL); /* not a readdir */
  CHECK_RC(ums_fs_stat_end(q, NULL), UMS_EINVAL);
  CHECK_EQ(write(p[1], "hey", 3), 3);
  CHECK_RC(ums_park_wait(), 0);
  /* Only the task that began it may end it (the other task's join does
  ** not disturb this park's outcome). */
  ums_task_t other;
  CHECK_RC(ums_task_spawn(rt, NULL, other_task_end, q, &other), 0);
  void *res = NULL;
  CHECK_RC(ums_task_join(rt, other, UMS_FOREVER, &res, NULL), 0);
  CHECK(res);
  CHECK_EQ(ums_fs_end(q), 3);
  CHECK(memcmp(ums_buf_data(b), "hey", 3) == 0);

  /* A cancelled task: refused, except that a close still closes. */
  CHECK_RC(ums_task_cancel(rt, ums_self()), 0);
  q = NULL;
  CHECK_RC(ums_fs_read_begin(fd, b, 0, 1, 0, UMS_FOREVER, &q), UMS_ECANCELED);
  CHECK_RC(ums_fs_close_begin(p[0], UMS_FOREVER, &q), UMS_ECANCELED);
  CHECK(q == NULL);
  errno = 0;
  CHECK_EQ(fcntl(p[0], F_GETFD), -1);
  CHECK_EQ(errno, EBADF);
  close(p[1]);
  close(fd);
  unlink(file);
  ums_buf_release(b);
  return PTR(1);
}

static void test_deferred_misuse(void) {
  CHECK(tu_in_task(rt, 0, deferred_misuse, NULL));
  /* A host thread has no park to end: it uses the blocking calls. */
  ums_buf_t *b = ums_buf_new(16);
  ums_fs_req_t *q = NULL;
  CHECK_RC(ums_fs_read_begin(0, b, 0, 1, 0, UMS_FOREVER, &q), UMS_EPERM);
  CHECK_RC(ums_fs_stat_begin(dir, 0, UMS_FOREVER, &q), UMS_EPERM);
  int fd = open(dir, O_RDONLY);
  CHECK_GE(fd, 0);
  CHECK_RC(ums_fs_close_begin(fd, UMS_FOREVER, &q), UMS_EPERM);
  CHECK_EQ(close(fd), 0);  /* not closed by the refused call */
  CHECK(q == NULL);
  ums_buf_release(b);
}

/* Request structs come back from the scheduler's cache: a second request
** reuses the first one's struct (no malloc per call). */
static void *deferred_cache(void *arg) {
  (void)arg;
  char file[512];
  path_of(file, "cache.dat");
  int fd = open(file, O_CREAT | O_RDWR | O_TRUNC, 0600);
  CHECK_GE(fd, 0);
  CHECK_EQ(write(fd, "0123456789", 10), 10);
  ums_buf_t *b = ums_buf_new(16);
  ums_fs_req_t *first = NULL, *q = NULL;
  CHECK_RC(ums_fs_read_begin(fd, b, 0, 10, 0, UMS_FOREVER, &first), 0);
  CHECK_RC(ums_park_wait(), 0);
  CHECK_EQ(ums_fs_end(first), 10);
  for (int i = 0; i < 100; i++) {
    CHECK_RC(ums_fs_read_begin(fd, b, 0, 10, 0, UMS_FOREVER, &q), 0);
    CHECK_PTR_EQ(q, first);
    CHECK_RC(ums_park_wait(), 0);
    CHECK_EQ(ums_fs_end(q), 10);
  }
  /* The blocking calls use the same cache. */
  CHECK_EQ(ums_fs_read(fd, b, 0, 10, 0, UMS_FOREVER), 10);
  CHECK_RC(ums_fs_read_begin(fd, b, 0, 10, 0, UMS_FOREVER, &q), 0);
  CHECK_PTR_EQ(q, first);
  CHECK_RC(ums_park_wait(), 0);
  CHECK_EQ(ums_fs_end(q), 10);
  close(fd);
  unlink(file);
  ums_buf_release(b);
  return PTR(1);
}

static void test_deferred_cache(void) {
  CHECK(tu_in_task(rt, 0, deferred_cache, NULL));
}

/* Step tasks: a read on a pipe begun in one step, collected in the next.
** Between the two the task holds no worker. */
typedef struct step_read {
  int fd;
  int64_t timeout;       /* ns; -1: none */
  int phase;
  ums_buf_t *b;
  ums_fs_req_t *q;
  _Atomic int begun;
  int64_t result;
  int64_t elapsed;
  int64_t t0;
  char data[8];
} step_read_t;

static int step_reader(void *arg) {
  step_read_t *s = arg;
  if (s->phase == 0) {
    s->b = ums_buf_new(64);
    s->t0 = ums_now();
    int rc = ums_fs_read_begin(
        s->fd, s->b, 0, 64, UMS_FS_CUR,
        s->timeout < 0 ? UMS_FOREVER : ums_deadline(s->timeout), &s->q);
    if (rc) {
      /* A task cancelled before it started is still stepped once. */
      s->result = rc;
      ums_buf_release(s->b);
      atomic_store(&s->begun, 1);
      return UMS_STEP_DONE;
    }
    s->phase = 1;
    atomic_store(&s->begun, 1);
    return UMS_STEP_PARK;
  }
  s->result = ums_fs_end(s->q);
  s->elapsed = ums_now() - s->t0;
  if (s->result > 0)
    memcpy(s->data, ums_buf_data(s->b),
           (size_t)s->result < sizeof s->data ? (size_t)s->result
                                              : sizeof s->data);
  /* The caller's reference goes now; an abandoned request keeps its own
  ** until the kernel (or the pool thread) is done with the buffer. */
  ums_buf_release(s->b);
  return UMS_STEP_DONE;
}

static ums_task_t spawn_step_reader(int sched, step_read_t *s) {
  ums_spawn_opts_t o = {.sched = sched};
  ums_task_t t;
  CHECK_RC(ums_task_spawn_step(rt, &o, step_reader, s, &t), 0);
  return t;
}

/* A C task blocked in ums_fs_read holds its worker: the contrast that
** shows workers_active counts what a step task does not hold. */
static void *blocking_pipe_read(void *arg) {
  ums_buf_t *b = ums_buf_new(8);
  int64_t n = ums_fs_read(*(int *)arg, b, 0, 8, UMS_FS_CUR, UMS_FOREVER);
  CHECK_EQ(n, 1);
  ums_buf_release(b);
  return PTR(1);
}

#define NSTEP 64

static void test_deferred_no_worker(void) {
  ums_runtime_t *saved = rt;
  /* With the pool backend each read in flight blocks a pool thread: room
  ** for all of them and for the blocking reads below. */
  rt = tu_runtime_new_cfg(&((ums_config_t){.schedulers = 1,
                                           .io_pool_threads = NSTEP + 8}));
  static step_read_t s[NSTEP];
  int p[NSTEP][2];
  ums_task_t t[NSTEP];
  for (int i = 0; i < NSTEP; i++) {
    CHECK_EQ(pipe(p[i]), 0);
    s[i] = (step_read_t){.fd = p[i][0], .timeout = -1};
    t[i] = spawn_step_reader(0, &s[i]);
  }
  for (int i = 0; i < NSTEP; i++) WAIT_UNTIL(atomic_load(&s[i].begun), 5000);
  WAIT_UNTIL(io_pending() == NSTEP, 5000);
  /* Every read is in flight and no worker carries a task. */
  ums_sched_stats_t st = tu_stats(rt, 0);
  printf("   %d reads in flight, %" PRIu64 " workers busy\n", NSTEP,
         st.workers_active);
  CHECK_EQ(st.workers_active, 0);
  CHECK_EQ(st.io_pending, NSTEP);
  /* The same wait in the blocking form binds a worker per task. */
  int cp[4][2];
  ums_task_t ct[4];
  for (int i = 0; i < 4; i++) {
    CHECK_EQ(pipe(cp[i]), 0);
    ums_spawn_opts_t o = {.sched = 0};
    CHECK_RC(ums_task_spawn(rt, &o, blocking_pipe_read, &cp[i][0], &ct[i]),
             0);
  }
  WAIT_UNTIL(io_pending() == NSTEP + 4, 5000);
  CHECK_EQ(tu_stats(rt, 0).workers_active, 4);
  for (int i = 0; i < 4; i++) {
    CHECK_EQ(write(cp[i][1], "c", 1), 1);
    CHECK_RC(ums_task_join(rt, ct[i], UMS_FOREVER, NULL, NULL), 0);
    close(cp[i][0]);
    close(cp[i][1]);
  }
  for (int i = 0; i < NSTEP; i++) {
    char msg[8];
    int n = snprintf(msg, sizeof msg, "r%d", i);
    CHECK_EQ(write(p[i][1], msg, (size_t)n), n);
  }
  for (int i = 0; i < NSTEP; i++) {
    CHECK_RC(ums_task_join(rt, t[i], UMS_FOREVER, NULL, NULL), 0);
    char msg[8];
    int n = snprintf(msg, sizeof msg, "r%d", i);
    CHECK_EQ(s[i].result, n);
    CHECK(memcmp(s[i].data, msg, (size_t)n) == 0);
  }
  /* The pool thread lowers io_pending after its unpark (io.c, for the
  ** virtual clock), so a join can return before it does. */
  WAIT_UNTIL(io_pending() == 0, 5000);
  tu_runtime_shutdown(rt);
  rt = saved;
  for (int i = 0; i < NSTEP; i++) {
    close(p[i][0]);
    close(p[i][1]);
  }
}

/* The deadline passes with the read in flight: UMS_ETIMEDOUT, and the
** abandoned read ends (cancelled in the kernel, or interrupted on the
** pool). */
static void test_deferred_timeout(void) {
  int p[2];
  CHECK_EQ(pipe(p), 0);
  for (int sched = 0; sched < ums_runtime_schedulers(rt); sched++) {
    step_read_t s = {.fd = p[0], .timeout = tu_ms(50)};
    ums_task_t t = spawn_step_reader(sched, &s);
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), 0);
    CHECK_RC((int)s.result, UMS_ETIMEDOUT);
    CHECK_GE(s.elapsed, tu_ms(50));
    CHECK_LT(s.elapsed, tu_ms(5000));
    if (settle_abandoned_read(p[1])) {
      /* Only a pool interrupt can be lost. */
      ums_config_t c;
      ums_runtime_config(rt, &c);
      CHECK_EQ(c.io_backend, UMS_IO_POOL);
    }
  }
  /* Nothing consumed the pipe: the abandoned reads really ended. */
  CHECK_EQ(write(p[1], "x", 1), 1);
  char ch = 0;
  for (;;) {
    CHECK_EQ(read(p[0], &ch, 1), 1);
    if (ch == 'x') break;
  }
  close_late(p[0]);
  close_late(p[1]);
}

/* Cancelled with the read in flight: UMS_ECANCELED; the read ends. */
static void test_deferred_cancel(void) {
  int p[2], lost = 0;
  CHECK_EQ(pipe(p), 0);
  for (int round = 0; round < 20; round++) {
    step_read_t s = {.fd = p[0], .timeout = -1};
    ums_task_t t = spawn_step_reader(round % ums_runtime_schedulers(rt), &s);
    /* Round 0 cancels at once: the task may not have started, and its
    ** begin is then refused (a step task cancelled before it started is
    ** still stepped once); the result is the same. */
    if (round > 0) WAIT_UNTIL(atomic_load(&s.begun) && io_pending() == 1, 5000);
    if (round % 2) usleep(1000);
    CHECK_RC(ums_task_cancel(rt, t), 0);
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), 0);
    CHECK_RC((int)s.result, UMS_ECANCELED);
    if (settle_abandoned_read(p[1])) lost++;
  }
  if (lost) printf("   %d of 20 pool interrupts lost (read ended by data)\n", lost);
  ums_config_t c;
  ums_runtime_config(rt, &c);
  if (c.io_backend == UMS_IO_URING) CHECK_EQ(lost, 0);
  CHECK_EQ(write(p[1], "x", 1), 1);
  char ch = 0;
  for (;;) {
    CHECK_EQ(read(p[0], &ch, 1), 1);
    if (ch == 'x') break;
  }
  close_late(p[0]);
  close_late(p[1]);
}

/* ====================================================================== */
/* Idle: no CPU                                                            */
/* ====================================================================== */

static int64_t cpu_ns(void) {
  struct rusage ru;
  CHECK_EQ(getrusage(RUSAGE_SELF, &ru), 0);
  return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * UMS_NSEC_PER_SEC +
         ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}

static void *sleeper(void *arg) {
  CHECK_RC(ums_sleep((int64_t)(uintptr_t)arg), 0);
  return PTR(1);
}

static void test_idle_cpu(void) {
  /* A scheduler whose only task sleeps 200 ms, another with a read in
  ** flight on a pipe: neither may poll. */
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  ums_runtime_t *saved = rt;
  rt = tu_runtime_new(2);
  pipe_read_t p = {.fd = fds[0], .timeout = tu_ms(400)};
  ums_spawn_opts_t o1 = {.sched = 1};
  ums_task_t reader;
  CHECK_RC(ums_task_spawn(rt, &o1, pipe_reader, &p, &reader), 0);
  WAIT_UNTIL(io_pending() == 1, 5000);
  uint64_t w0 = tu_stats(rt, 0).idle_waits + tu_stats(rt, 1).idle_waits;
  int64_t c0 = cpu_ns(), t0 = ums_now();
  CHECK(tu_in_task(rt, 0, sleeper, PTR(tu_ms(200))));
  int64_t cpu = cpu_ns() - c0, wall = ums_now() - t0;
  uint64_t waits = tu_stats(rt, 0).idle_waits + tu_stats(rt, 1).idle_waits -
                   w0;
  printf("   %.2f ms CPU and %llu idle waits in %.0f ms with both "
         "schedulers idle\n", cpu / 1e6, (unsigned long long)waits,
         wall / 1e6);
  CHECK_GE(wall, tu_ms(200));
  /* Polling every millisecond would wake up about 400 times. Counted,
  ** not timed: the CPU a few wake-ups cost depends on the build (TSan)
  ** and on strace, which the fault runs of this test add. */
  CHECK_LT(waits, 40);
  /* And nothing spins meanwhile. */
  CHECK_LT(cpu, wall / 2);
  CHECK_RC(ums_task_join(rt, reader, UMS_FOREVER, NULL, NULL), 0);
  CHECK_RC((int)p.result, UMS_ETIMEDOUT);
  tu_runtime_shutdown(rt);
  rt = saved;
  close(fds[0]);
  close(fds[1]);
}

/* A wake-up from another thread ends the idle wait promptly (with a ring,
** the idle wait is io_uring_enter, woken through the eventfd). */
static void *event_waiter(void *arg) {
  CHECK_RC(ums_event_wait(arg, ums_deadline(10 * UMS_NSEC_PER_SEC)), 0);
  return PTR(1);
}

static void test_idle_wake(void) {
  for (int i = 0; i < 50; i++) {
    ums_event_t *e = ums_event_new(0, 0);
    ums_spawn_opts_t o = {.sched = 0};
    ums_task_t t;
    CHECK_RC(ums_task_spawn(rt, &o, event_waiter, e, &t), 0);
    WAIT_UNTIL(tu_stats(rt, 0).idle, 5000);
    int64_t t0 = ums_now();
    CHECK_RC(ums_event_set(e), 0);
    CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), 0);
    CHECK_LT(ums_now() - t0, 2 * UMS_NSEC_PER_SEC);
    CHECK_RC(ums_event_delete(e), 0);
  }
}

/* ====================================================================== */

static void rm_tree(const char *path) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

int main(int argc, char **argv) {
  bool short_only = false;
  const char *full_fs = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--expect-backend=uring") == 0)
      expect_backend = UMS_IO_URING;
    else if (strcmp(argv[i], "--expect-backend=pool") == 0)
      expect_backend = UMS_IO_POOL;
    else if (strcmp(argv[i], "--short-write") == 0)
      short_only = true;
    else if (strncmp(argv[i], "--full-fs=", 10) == 0)
      short_only = true, full_fs = argv[i] + 10;
    else {
      fprintf(stderr,
              "usage: %s [--expect-backend=uring|pool] "
              "[--short-write | --full-fs=<dir>]\n",
              argv[0]);
      return 2;
    }
  }
  /* Not TMPDIR for the full file system: a sanitizer runtime may keep
  ** files of its own there. */
  const char *base = full_fs ? full_fs : getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/ums-test-io-XXXXXX", base ? base : "/tmp");
  CHECK(mkdtemp(dir) != NULL);
  rt = tu_runtime_new(2);
  RUN(test_backend);
  if (short_only) {
    /* Under a file size limit (test_io_shortwrite): big_offset and the
    ** others would hit it. */
    if (full_fs)
      RUN(test_full_fs);
    else
      RUN(test_short_write);
    tu_runtime_shutdown(rt);
    rm_tree(dir);
    return 0;
  }
  RUN(test_short_write);
  RUN(test_ops_task);
  RUN(test_ops_other_sched);
  RUN(test_ops_host);
  RUN(test_readfile_task);
  RUN(test_readfile_host);
  RUN(test_readfile_many);
  RUN(test_bad_input);
  RUN(test_buffers);
  RUN(test_big_file);
  RUN(test_read_while_write);
  RUN(test_many_tasks);
  RUN(test_timeout_in_flight);
  RUN(test_cancel_in_flight);
  RUN(test_pool_growth);
  RUN(test_open_abandoned);
  RUN(test_close_cancelled);
  RUN(test_idle_wake);
  RUN(test_deferred_ops);
  RUN(test_deferred_misuse);
  RUN(test_deferred_cache);
  RUN(test_deferred_timeout);
  RUN(test_deferred_cancel);
  CHECK_EQ(io_pending(), 0);
  tu_runtime_shutdown(rt);
  RUN(test_shutdown_in_flight);
  RUN(test_idle_cpu);
  RUN(test_deferred_no_worker);
  for (int i = 0; i < nlate; i++) close(late_fds[i]);
  rm_tree(dir);
  return 0;
}
