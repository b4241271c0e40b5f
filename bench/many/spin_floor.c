/*
** spin_floor.c: the floor of a hand-off between two threads: a token
** passed back and forth through one atomic word, each thread spinning
** until the word says it is its turn. No kernel, no queue, no copy: what
** a cross-scheduler message cannot beat on this machine.
**
**   spin_floor [N]   N round trips (default 1,000,000)
**
** Prints "spin_floor MESSAGES seconds result" (MESSAGES = 2N one-way
** hops; the result is the number of round trips, which checks the run).
*/
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Atomic long turn;  /* odd: the echo thread's turn */
static long rounds;

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void *echo(void *arg) {
  (void)arg;
  for (long i = 0; i < rounds; i++) {
    long want = 2 * i + 1;
    while (atomic_load_explicit(&turn, memory_order_acquire) != want)
      relax();
    atomic_store_explicit(&turn, want + 1, memory_order_release);
  }
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  rounds = argc > 1 ? atol(argv[1]) : 1000000;
  if (rounds < 1) {
    fprintf(stderr, "spin_floor: N must be a positive whole number\n");
    return 2;
  }
  pthread_t th;
  if (pthread_create(&th, NULL, echo, NULL) != 0) return 1;
  double t0 = now();
  long done = 0;
  for (long i = 0; i < rounds; i++) {
    atomic_store_explicit(&turn, 2 * i + 1, memory_order_release);
    while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 2)
      relax();
    done++;
  }
  double dt = now() - t0;
  pthread_join(th, NULL);
  printf("spin_floor %ld %.6f %ld\n", 2 * rounds, dt, done);
  return 0;
}
