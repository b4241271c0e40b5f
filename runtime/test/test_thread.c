/*
** test_thread.c: the runtime's threads kept parked for the process
** between runtimes (thread.c, ums_config_t.keep_threads): a runtime that
** keeps them leaves exactly its scheduler and monitor threads behind, the
** next runtime uses those instead of new ones (the same kernel thread
** ids, whatever the number of runtimes), each role gets its own signal
** mask and name on a reused thread, parked threads block every signal,
** a child made by fork starts afresh, a runtime without keep_threads
** leaves nothing, not even the parked threads it took, and a new thread
** handed its next role before it has started names itself without
** racing the one who hands it.
*/
#include "test-util.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

/* The kernel ids of this process's threads, sorted, into ids (at most
** max); returns how many. */
static int thread_ids(int *ids, int max) {
  DIR *d = opendir("/proc/self/task");
  CHECK(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    CHECK(n < max);
    ids[n++] = atoi(e->d_name);
  }
  closedir(d);
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
      int t = ids[j];
      ids[j] = ids[j - 1];
      ids[j - 1] = t;
    }
  return n;
}

/* A line of /proc/self/task/<tid>/status, e.g. "SigBlk:", into out. */
static void task_status(int tid, const char *key, char *out, size_t len) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/status", tid);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  out[0] = '\0';
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, strlen(key)) == 0) {
      snprintf(out, len, "%s", line + strlen(key));
      break;
    }
  }
  fclose(f);
  CHECK(out[0] != '\0');
}

static void task_comm(int tid, char *out, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  CHECK(fgets(out, (int)len, f) != NULL);
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

static ums_runtime_t *keeping_runtime(void) {
  ums_config_t c = {.schedulers = 1, .keep_threads = 2};
  int err = 1;
  ums_runtime_t *rt = ums_runtime_new(&c, &err);
  CHECK(rt != NULL);
  CHECK_RC(err, 0);
  return rt;
}

/* What a task sees of its scheduler thread. */
struct seen {
  int tid;
  sigset_t mask;
};

static void *look(void *arg) {
  struct seen *s = arg;
  s->tid = gettid();
  pthread_sigmask(SIG_BLOCK, NULL, &s->mask);
  return NULL;
}

static struct seen run_one(ums_runtime_t *rt) {
  struct seen s = {0};
  ums_task_t t;
  CHECK_RC(ums_task_spawn(rt, NULL, look, &s, &t), 0);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL), 0);
  return s;
}

static bool contains(const int *ids, int n, int id) {
  for (int i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

static void test_reused(void) {
  int base = tu_thread_baseline();
  ums_runtime_t *rt = keeping_runtime();
  run_one(rt);
  CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
  /* Its scheduler and its monitor are parked, and nothing else is left. */
  CHECK_EQ(tu_thread_count(), base + 2);
  int kept[64];
  int nkept = thread_ids(kept, 64);
  for (int i = 0; i < 50; i++) {
    rt = keeping_runtime();
    /* No thread of this runtime is a new one... */
    int now[64];
    int n = thread_ids(now, 64);
    CHECK_EQ(n, nkept);
    for (int j = 0; j < n; j++) CHECK_EQ(now[j], kept[j]);
    /* ... and its tasks run on one of the kept threads. */
    struct seen s = run_one(rt);
    CHECK(contains(kept, nkept, s.tid));
    char comm[32];
    task_comm(s.tid, comm, sizeof comm);
    CHECK_STR_EQ(comm, "ums-sched");
    CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
  }
  CHECK_EQ(tu_thread_count(), base + 2);
}

/* A scheduler on a reused thread runs its tasks with the signal mask of
** the thread that started the runtime, as a new thread would inherit it,
** while parked threads block every signal. */
static void test_masks(void) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  ums_runtime_t *rt = keeping_runtime();
  struct seen s = run_one(rt);
  CHECK(sigismember(&s.mask, SIGUSR2));
  CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
  pthread_sigmask(SIG_SETMASK, &old, NULL);

  rt = keeping_runtime();
  s = run_one(rt);
  CHECK(!sigismember(&s.mask, SIGUSR2));
  CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);

  /* Parked: every signal blocked, those a host handles included. */
  char blk[256];
  task_status(s.tid, "SigBlk:", blk, sizeof blk);
  unsigned long long bits = strtoull(blk, NULL, 16);
  int sigs[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGCHLD, SIGRTMIN + 5};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    CHECK(bits & (1ull << (sigs[i] - 1)));
}

/* A child made by fork has none of the parent's parked threads: its first
** runtime creates its own, keeps them, and the child exits cleanly. */
static void test_fork(void) {
#ifdef TU_TSAN
  /* TSan refuses to start threads in a child of a multi-threaded
  ** process. */
  return;
#endif
  ums_runtime_t *rt = keeping_runtime();
  run_one(rt);
  CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    /* Only this thread (and, under a sanitizer, its helper). */
    int c0 = tu_thread_count(), c1 = 0;
    if (c0 > 2) _exit(10);
    for (int i = 0; i < 5; i++) {
      rt = keeping_runtime();
      run_one(rt);
      if (ums_runtime_shutdown(rt, UMS_FOREVER) != 0) _exit(11);
      if (i == 0) c1 = tu_thread_count();
      if (c1 < c0 + 2 || tu_thread_count() != c1) _exit(12);
    }
    exit(0);  /* joins the parked threads (thread.c's destructor) */
  }
  int st = 0;
  CHECK_EQ(waitpid(pid, &st, 0), pid);
  CHECK(WIFEXITED(st));
  CHECK_EQ(WEXITSTATUS(st), 0);
}

/* Without keep_threads a runtime leaves nothing, even when it started on
** threads another runtime left parked. */
static void test_not_kept(void) {
  CHECK_EQ(tu_thread_count(), tu_thread_baseline() + 2);
  for (int i = 0; i < 5; i++) {
    ums_config_t c = {.schedulers = 2};
    ums_runtime_t *rt = ums_runtime_new(&c, NULL);
    CHECK(rt != NULL);
    run_one(rt);
    CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
    /* It took the parked threads, and ended them with its own. */
    CHECK_THREADS(tu_thread_baseline());
  }
  ums_config_t bad = {.keep_threads = -1};
  int err = 0;
  CHECK(ums_runtime_new(&bad, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
}

/* A new thread names itself as it starts, which may be after the role it
** was made for has been taken back and the thread handed a role of
** another name: the name it starts with must not be the one its next
** role is being given meanwhile (TSan sees the two threads touch it).
** Each round begins with no thread parked (a runtime without
** keep_threads ends those it takes), so that the first runtime's
** threads are new, and the second runtime takes them up at once. */
static void test_renamed_while_starting(void) {
  ums_config_t drain = {.schedulers = 2};
  ums_config_t keep = {.schedulers = 1, .run_on_caller = 1,
                       .keep_threads = 2};
  ums_config_t keep2 = {.schedulers = 1, .keep_threads = 2};
  for (int i = 0; i < 30; i++) {
    ums_runtime_t *rt = ums_runtime_new(&drain, NULL);
    CHECK(rt != NULL);
    CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
    /* Its one new thread is the monitor, taken back at once... */
    rt = ums_runtime_new(&keep, NULL);
    CHECK(rt != NULL);
    CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
    /* ... and made a scheduler here, perhaps before it has started. */
    rt = ums_runtime_new(&keep2, NULL);
    CHECK(rt != NULL);
    run_one(rt);
    CHECK_RC(ums_runtime_shutdown(rt, UMS_FOREVER), 0);
  }
}

int main(void) {
  RUN(test_reused);
  RUN(test_masks);
  RUN(test_fork);
  RUN(test_not_kept);
  RUN(test_renamed_while_starting);
  return 0;
}
