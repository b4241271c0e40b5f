/*
** dns.c: name resolution that never blocks a scheduler
** (ums_net_getaddrinfo, ums.h "Sockets").
**
** Numeric hosts (and a NULL host, the wildcard or loopback address) are
** answered by getaddrinfo(3) with AI_NUMERICHOST on the calling thread:
** that makes no lookup. A name listed in /etc/hosts is answered the same
** way, from its numeric addresses, after one read of that small local
** file. Every other name goes to the C-call pool (preempt.c), where the
** C library's getaddrinfo runs with everything it honours (nsswitch.conf,
** resolv.conf, search domains); the calling task parks meanwhile. A call
** whose caller gave up (deadline, cancel) is detached like any pool call:
** the request, and the list getaddrinfo makes for it, are freed by the
** pool thread when getaddrinfo returns (release_req).
**
** The choice of getaddrinfo on the pool over c-ares (docs/design/io.md,
** "Name resolution") keeps the C library's answers: the same sources in
** the same order as every other program on the machine.
*/
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

/* A request. Owned by the caller from begin to end; while a pool call
** runs it belongs to that call, and to release_req once the caller gave
** up (ums_preempt's "Ownership of arg"). */
struct ums_dns_req {
  char *host;                 /* NULL: none (hints' AI_PASSIVE decides) */
  char *service;              /* NULL: none */
  struct addrinfo hints;
  bool has_hints;
  struct addrinfo *res;       /* getaddrinfo's list, until handed out */
  int eai;                    /* getaddrinfo's result */
  int err;                    /* its errno, for EAI_SYSTEM */
  ums_preempt_call_t *call;   /* the pool call; NULL when answered here */
};

static void free_req(struct ums_dns_req *r) {
  if (!r) return;
  if (r->res) freeaddrinfo(r->res);
  free(r->host);
  free(r->service);
  free(r);
}

static void release_req(void *arg) { free_req(arg); }

/* Runs on a pool thread (or here, for a numeric host). */
static void run_req(void *arg) {
  struct ums_dns_req *r = arg;
  errno = 0;
  r->eai = getaddrinfo(r->host, r->service, r->has_hints ? &r->hints : NULL,
                       &r->res);
  r->err = errno;
}

/* Appends list b to list *a. */
static void append(struct addrinfo **a, struct addrinfo *b) {
  while (*a) a = &(*a)->ai_next;
  *a = b;
}

/* Resolves r->host from /etc/hosts: true when the file names it (the
** result, or its error, is then in r). Each numeric address of the name's
** lines, in the file's order, through getaddrinfo with AI_NUMERICHOST. */
static bool from_hosts(struct ums_dns_req *r) {
  if (!r->host) return false;
  FILE *fp = fopen("/etc/hosts", "re");
  if (!fp) return false;
  struct addrinfo hints = {0};
  if (r->has_hints) hints = r->hints;
  hints.ai_flags |= AI_NUMERICHOST;
  hints.ai_flags &= ~(AI_CANONNAME | AI_ADDRCONFIG);
  bool found = false;
  int first_eai = 0;
  char line[1024];
  while (fgets(line, sizeof line, fp)) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *save = NULL;
    char *addr = strtok_r(line, " \t\r\n", &save);
    if (!addr) continue;
    for (char *name; (name = strtok_r(NULL, " \t\r\n", &save)) != NULL;) {
      if (strcasecmp(name, r->host) != 0) continue;
      found = true;
      struct addrinfo *res = NULL;
      int eai = getaddrinfo(addr, r->service, &hints, &res);
      if (eai == 0)
        append(&r->res, res);
      else if (!first_eai)
        first_eai = eai;
      break;
    }
  }
  fclose(fp);
  if (!found) return false;
  /* A name listed only with the other family's addresses: as the C
  ** library, no address of the family asked for. */
  r->eai = r->res ? 0 : (first_eai == EAI_FAMILY ? EAI_NODATA : first_eai
                                                      ? first_eai
                                                      : EAI_NODATA);
  if (r->eai == EAI_ADDRFAMILY) r->eai = EAI_NODATA;
  return true;
}

/* Whether host is a numeric address (IPv4 or IPv6, an IPv6 scope
** included): getaddrinfo answers it without a lookup. */
static bool numeric(const char *host) {
  unsigned char buf[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, host, buf) == 1) return true;
  const char *pct = strchr(host, '%');
  if (!pct) return inet_pton(AF_INET6, host, buf) == 1;
  char tmp[INET6_ADDRSTRLEN];
  size_t n = (size_t)(pct - host);
  if (n >= sizeof tmp) return false;
  memcpy(tmp, host, n);
  tmp[n] = '\0';
  return inet_pton(AF_INET6, tmp, buf) == 1;
}

/* A new request with copies of the arguments, in *out. A service name
** ("http") is read from /etc/services by the C library, a local file, on
** whichever thread answers. */
static int make_req(const char *host, const char *service,
                    const struct addrinfo *hints,
                    struct ums_dns_req **out) {
  if (!host && !service) return UMS_EINVAL;
  struct ums_dns_req *r = calloc(1, sizeof *r);
  if (!r) return UMS_ENOMEM;
  if ((host && !(r->host = strdup(host))) ||
      (service && !(r->service = strdup(service)))) {
    free_req(r);
    return UMS_ENOMEM;
  }
  if (hints) {
    r->hints.ai_flags = hints->ai_flags;
    r->hints.ai_family = hints->ai_family;
    r->hints.ai_socktype = hints->ai_socktype;
    r->hints.ai_protocol = hints->ai_protocol;
    r->has_hints = true;
  }
  *out = r;
  return 0;
}

/* Answers r on the calling thread if that needs no lookup: true then. */
static bool answer_here(struct ums_dns_req *r) {
  if (!r->host || numeric(r->host)) {
    run_req(r);
    return true;
  }
  return from_hosts(r);
}

int ums_net_getaddrinfo_begin(const char *host, const char *service,
                              const struct addrinfo *hints,
                              int64_t deadline, ums_dns_req_t **req) {
  if (!req) return UMS_EINVAL;
  if (!ums__task_current()) return UMS_EPERM;
  struct ums_dns_req *r;
  int rc = make_req(host, service, hints, &r);
  if (rc) return rc;
  if (answer_here(r)) {
    *req = r;
    return 1;
  }
  /* From here r belongs to the call (release_req on every error). */
  ums_preempt_call_t *call;
  rc = ums_preempt_begin(run_req, r, release_req, deadline, &call);
  if (rc) return rc;
  r->call = call;  /* run_req touches neither this field nor *req */
  *req = r;
  return 0;
}

/* Maps getaddrinfo's failure to the runtime's codes. */
static int eai_code(int eai, int err) {
  switch (eai) {
    case 0: return 0;
    case EAI_NONAME:
    case EAI_NODATA:
    case EAI_ADDRFAMILY:
    case EAI_FAIL: return UMS_ENOENT;
    case EAI_AGAIN: return UMS_EAGAIN;
    case EAI_MEMORY: return UMS_ENOMEM;
    case EAI_SYSTEM: return err ? -err : UMS_EIO;
    default: return UMS_EINVAL;  /* EAI_FAMILY, EAI_SOCKTYPE, EAI_SERVICE,
                                    EAI_BADFLAGS */
  }
}

int ums_net_getaddrinfo_end(ums_dns_req_t *req, struct addrinfo **res,
                            int *eai) {
  if (!req) return UMS_EINVAL;
  if (req->call) {
    int rc = ums_preempt_end(req->call);
    /* On failure the request went with the detached call. */
    if (rc) {
      if (eai) *eai = 0;
      return rc;
    }
  }
  int rc = eai_code(req->eai, req->err);
  if (eai) *eai = req->eai;
  if (rc == 0 && res) {
    *res = req->res;
    req->res = NULL;
  }
  free_req(req);
  return rc;
}

int ums_net_getaddrinfo(const char *host, const char *service,
                        const struct addrinfo *hints, struct addrinfo **res,
                        int *eai, int64_t deadline) {
  if (!res) return UMS_EINVAL;
  ums_dns_req_t *req;
  if (!ums__task_current()) {
    int rc = make_req(host, service, hints, &req);
    if (rc) return rc;
    if (!answer_here(req)) run_req(req);
    return ums_net_getaddrinfo_end(req, res, eai);
  }
  int rc = ums_net_getaddrinfo_begin(host, service, hints, deadline, &req);
  if (rc < 0) return rc;
  if (rc == 0) ums_park_wait();
  return ums_net_getaddrinfo_end(req, res, eai);
}
