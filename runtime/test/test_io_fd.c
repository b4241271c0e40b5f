/*
** test_io_fd: descriptors the ring opens and closes where ThreadSanitizer
** cannot see them. A readfile on io_uring opens its file in the kernel,
** asks what it opened (ums__io_readfile_kind) on the scheduler's thread
** and closes it in the kernel again. If that question went through a
** call TSan intercepts, TSan would keep a record of the descriptor's
** number that no close clears, and the next thread to get that number
** from an intercepted open and close (the I/O pool's opendir for
** ums.fs.dir) would be reported racing with it, with nothing shared.
**
** The test plays both sides with system calls TSan does not see for the
** ring's part, and a relaxed flag (no synchronisation, as between a
** scheduler and a pool thread that have not talked since) for the order.
** In a TSan build with halt_on_error a report fails it; elsewhere it
** checks what ums__io_readfile_kind says about a file and a directory.
*/
#include "internal.h"
#include "test-util.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/syscall.h>

static char dir[64];
static char file[96];
static atomic_int stage;
static int ring_fd = -1;

/* The scheduler's side: open and close invisibly, ask in between. */
static void *sched_side(void *arg) {
  (void)arg;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, file, O_RDONLY | O_CLOEXEC);
  CHECK_GE(fd, 0);
  ums__io_req_t r;
  memset(&r, 0, sizeof r);
  r.fd = -1;
  CHECK_EQ(ums__io_readfile_kind(&r, fd), 0);
  CHECK_EQ(r.chain_size, 5);
  ring_fd = fd;
  CHECK_EQ(syscall(SYS_close, fd), 0);
  atomic_store_explicit(&stage, 1, memory_order_relaxed);
  return NULL;
}

/* The pool's side: the same number again, through intercepted calls. */
static void *pool_side(void *arg) {
  (void)arg;
  while (atomic_load_explicit(&stage, memory_order_relaxed) != 1)
    sched_yield();
  DIR *d = opendir(dir);
  CHECK(d != NULL);
  int n = 0;
  while (readdir(d)) n++;
  CHECK_GE(n, 3);
  CHECK_EQ(closedir(d), 0);
  return NULL;
}

int main(void) {
  strcpy(dir, "/tmp/ums-test-io-fd.XXXXXX");
  CHECK(mkdtemp(dir) != NULL);
  snprintf(file, sizeof file, "%s/f", dir);
  FILE *f = fopen(file, "w");
  CHECK(f != NULL);
  CHECK_EQ(fputs("hello", f) >= 0, 1);
  CHECK_EQ(fclose(f), 0);

  /* Both threads exist before either side runs: creating one after the
  ** other would order them. */
  pthread_t a, b;
  CHECK_EQ(pthread_create(&b, NULL, pool_side, NULL), 0);
  CHECK_EQ(pthread_create(&a, NULL, sched_side, NULL), 0);
  CHECK_EQ(pthread_join(a, NULL), 0);
  CHECK_EQ(pthread_join(b, NULL), 0);
  CHECK_GE(ring_fd, 0);

  /* A directory is read (and its read fails); its size does not count. */
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK_GE(fd, 0);
  ums__io_req_t r;
  memset(&r, 0, sizeof r);
  r.fd = -1;
  CHECK_EQ(ums__io_readfile_kind(&r, fd), 0);
  CHECK_EQ(r.chain_size, 0);
  CHECK_EQ(close(fd), 0);

  /* A stream is handed back open, unread. */
  int p[2];
  CHECK_EQ(pipe(p), 0);
  memset(&r, 0, sizeof r);
  r.fd = -1;
  CHECK_EQ(ums__io_readfile_kind(&r, p[0]), UMS_ESPIPE);
  CHECK_EQ(r.fd, p[0]);
  close(p[0]);
  close(p[1]);

  CHECK_EQ(unlink(file), 0);
  CHECK_EQ(rmdir(dir), 0);
  printf("test_io_fd: ok\n");
  return 0;
}
