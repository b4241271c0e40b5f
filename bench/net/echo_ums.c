/*
** The echo server on the runtime's C socket calls: a C task per
** connection, ums_net_recv then ums_net_send, on one or more schedulers.
**
**   echo_ums PORT [SCHEDULERS]     (default 1)
**
** Each scheduler runs its own listener on 127.0.0.1:PORT with SO_REUSEPORT
** and keeps the connections it accepts: the kernel spreads connections
** over the listeners, and nothing crosses schedulers afterwards (tasks
** never migrate, so a connection handed to another scheduler would cost a
** cross-thread wake-up for every connection and buy nothing here). The
** main thread waits for SIGTERM or SIGINT, then shuts the runtime down,
** which cancels the tasks still waiting on their sockets.
*/
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "ums.h"

#define BUF_SIZE 4096

static struct sockaddr_in addr;

/* One connection: its descriptor in arg. The task owns the descriptor and
** its buffer and releases both when the peer goes or the task is
** cancelled. */
static void *serve_conn(void *arg) {
  int fd = (int)(intptr_t)arg;
  ums_buf_t *buf = ums_buf_new(BUF_SIZE);
  int one = 1;
  ums_net_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  while (buf != NULL) {
    int64_t n = ums_net_recv(fd, buf, 0, BUF_SIZE, 0, UMS_FOREVER);
    if (n <= 0) break;
    int64_t off = 0;
    while (off < n) {
      int64_t w = ums_net_send(fd, buf, (size_t)off, (size_t)(n - off), 0,
                               UMS_FOREVER);
      if (w <= 0) goto done;
      off += w;
    }
  }
done:
  if (buf != NULL) ums_buf_release(buf);
  ums_net_close(fd, UMS_FOREVER);
  return NULL;
}

/* The listener of one scheduler; every connection it accepts gets a task
** on the same scheduler. */
static void *serve_listener(void *arg) {
  ums_runtime_t *rt = arg;
  int ls = ums_net_socket(AF_INET, SOCK_STREAM, 0);
  int one = 1, rc = ls < 0 ? ls : 0;
  if (rc == 0)
    rc = ums_net_setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (rc == 0)
    rc = ums_net_setsockopt(ls, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (rc == 0) rc = ums_net_bind(ls, (struct sockaddr *)&addr, sizeof addr);
  if (rc == 0) rc = ums_net_listen(ls, SOMAXCONN);
  if (rc != 0) {
    fprintf(stderr, "echo_ums: listen: %s\n", ums_strerror(rc));
    exit(1);
  }
  ums_spawn_opts_t opts = {.sched = ums_current_sched(), .detached = 1};
  for (;;) {
    int fd = ums_net_accept(ls, NULL, NULL, UMS_FOREVER);
    if (fd == UMS_ECANCELED) break;
    if (fd < 0) {
      /* EMFILE and the like: the connection stays queued; wait a little
      ** rather than spin on it. */
      ums_sleep(10 * UMS_NSEC_PER_MSEC);
      continue;
    }
    if (ums_task_spawn(rt, &opts, serve_conn, (void *)(intptr_t)fd, NULL))
      ums_net_close(fd, UMS_FOREVER);
  }
  ums_net_close(ls, UMS_FOREVER);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: echo_ums PORT [SCHEDULERS]\n");
    return 2;
  }
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)atoi(argv[1]));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int scheds = argc > 2 ? atoi(argv[2]) : 1;

  /* Block the stop signals before the runtime's threads start, so that
  ** they inherit the mask and only sigwait below sees them. */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);

  ums_config_t cfg = {.schedulers = scheds};
  int err;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (rt == NULL) {
    fprintf(stderr, "echo_ums: %s\n", ums_runtime_error());
    return 1;
  }
  for (int i = 0; i < scheds; i++) {
    ums_spawn_opts_t opts = {.sched = i, .detached = 1, .name = "listener"};
    ums_task_spawn(rt, &opts, serve_listener, rt, NULL);
  }
  int sig;
  sigwait(&stop, &sig);
  ums_runtime_shutdown(rt, ums_deadline(0));
  return 0;
}
