/* bench/pmix_namespace.c (BENCHMARKS.md, issue 21): caller-side cost of one step's PMIx namespace on the agent's launch path: OLD = blocking
 * register (nspace + clients) + setup_fork per rank + blocking deregister; NEW = queued
 * register + queued deregister (setup_fork from a template: no call). 2 local ranks of 4.
 * Argument 2 "bound": the local ranks are bound (CPUs 0 and 1: their PMIX_CPUSET and
 * PMIX_LOCALITY_STRING are made too). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
int berth_pmix_register(const char *, const char *, uint32_t, const uint32_t *, uint32_t, const char *const *, uint32_t,
                        uint32_t, const uint32_t *, const uint32_t *, const char *const *, const char *, uint32_t,
                        uint32_t, char *, size_t);
void berth_pmix_deregister(const char *nspace);
#ifdef OLD
int berth_pmix_init(const char *, void *, void *, void *, char *, size_t);
int berth_pmix_setup_fork(const char *, uint32_t, char ***, char *, size_t);
void berth_pmix_free_env(char **env);
#else
int berth_pmix_init(const char *, void *, void *, void *, void *, char *, size_t);
#endif
static void nf(void) {}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  char err[512];
  char dir[] = "/tmp/berth-pmix-bench.XXXXXX";
  if (mkdtemp(dir) == NULL) { perror("mkdtemp"); return 1; }
#ifdef OLD
  if (berth_pmix_init(dir, nf, nf, nf, err, 512)) { puts(err); return 1; }
#else
  if (berth_pmix_init(dir, nf, nf, nf, nf, err, 512)) { puts(err); return 1; }
#endif
  const char *nodes[] = {"n0", "n1"};
  uint32_t rn[] = {0, 0, 1, 1}, rl[] = {0, 1, 0, 1};
  int N = argc > 1 ? atoi(argv[1]) : 200;
  const char *cpus[] = {"0", "1", NULL, NULL};
  const char *const *rank_cpus = argc > 2 && argv[2][0] == 'b' ? cpus : NULL;
  double *t = calloc(N, sizeof *t);
  for (int i = 0; i < N; i++) {
    char ns[64]; snprintf(ns, 64, "berth.%d.1", i);
    double t0 = now();
    if (berth_pmix_register(ns, ns, 4, NULL, 1, nodes, 2, 0, rn, rl, rank_cpus, dir, 1000, 1000, err, 512)) {
      puts(err);
      return 1;
    }
#ifdef OLD
    for (int r = 0; r < 2; r++) { char **env; berth_pmix_setup_fork(ns, r, &env, err, 512); berth_pmix_free_env(env); }
#endif
    double t1 = now();
    usleep(3000);
    double t2 = now();
    berth_pmix_deregister(ns);
    t[i] = (t1 - t0) + (now() - t2);
    usleep(3000);
  }
  qsort(t, N, sizeof *t, cmp);
  printf("%s%s gds=%s: per step, caller side: median %.3f ms p10 %.3f p90 %.3f (n=%d)\n",
#ifdef OLD
    "old",
#else
    "new",
#endif
    rank_cpus ? " bound" : "",
    getenv("PMIX_MCA_gds") ? getenv("PMIX_MCA_gds") : "default", t[N / 2], t[N / 10], t[N * 9 / 10], N);
  /* The server's rendezvous files stay in `dir` until PMIx_server_finalize; remove it by hand. */
  fprintf(stderr, "remove %s\n", dir);
  return 0;
}
