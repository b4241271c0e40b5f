/*
** The floor of the echo benchmark: one thread, one epoll set, level
** triggered, non-blocking sockets, a read and a write per message and no
** scheduler at all. Every server of bench/net/run.sh is compared with it.
**
**   echo_epoll PORT
**
** Serves 127.0.0.1:PORT until SIGTERM or SIGINT. A write the kernel does
** not take whole (a full send buffer, which 64-byte messages never meet)
** keeps the rest in the connection's buffer and waits for EPOLLOUT, so the
** floor is correct for any message size.
*/
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF_SIZE 4096

/* One connection; owned by the loop, freed when the peer goes. */
typedef struct conn {
  int fd;
  size_t pending, off; /* bytes of buf not yet written back, from off */
  char buf[BUF_SIZE];
} conn_t;

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static void conn_close(int ep, conn_t *c) {
  epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  free(c);
}

/* Writes what is pending; 0 when all of it went, 1 when the kernel's
** buffer is full, -1 when the connection failed. */
static int conn_flush(conn_t *c) {
  while (c->pending > 0) {
    ssize_t n = send(c->fd, c->buf + c->off, c->pending, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN ? 1 : -1;
    }
    c->off += (size_t)n;
    c->pending -= (size_t)n;
  }
  return 0;
}

static void conn_ready(int ep, conn_t *c, uint32_t events) {
  struct epoll_event ev = {.data.ptr = c};
  if (c->pending > 0) {
    int r = conn_flush(c);
    if (r < 0) goto fail;
    if (r > 0) return;
    ev.events = EPOLLIN;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
  }
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) goto fail;
  c->off = 0;
  c->pending = (size_t)n;
  int r = conn_flush(c);
  if (r < 0) goto fail;
  if (r > 0) {
    ev.events = EPOLLOUT;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
  }
  return;
fail:
  conn_close(ep, c);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: echo_epoll PORT\n");
    return 2;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sin = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (ls < 0 || bind(ls, (struct sockaddr *)&sin, sizeof sin) < 0 ||
      listen(ls, SOMAXCONN) < 0) {
    perror("echo_epoll: listen");
    return 1;
  }
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev);

  struct epoll_event evs[256];
  while (!stop) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      if (evs[i].data.ptr != NULL) {
        conn_ready(ep, evs[i].data.ptr, evs[i].events);
        continue;
      }
      /* The listener: take every connection queued. */
      for (;;) {
        int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_t *c = malloc(sizeof *c);
        if (c == NULL) {
          close(fd);
          continue;
        }
        c->fd = fd;
        c->pending = c->off = 0;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
      }
    }
  }
  close(ep);
  close(ls);
  return 0;
}
