// Reference for bench/launch.sh: the fork/exec floor of this machine. Spawns N x /bin/true the
// way a launcher does (stdout/stderr pipes, setsid, optional join of cgroup.procs files given
// after N), waiting for each exec through a CLOEXEC status pipe as Rust's Command::spawn does.
//   launch_floor N [cgroup.procs ...]
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int n = atoi(argv[1]), nf = argc - 2, fds[16];
  if (nf > 16) return 2;
  for (int i = 0; i < nf; i++)
    if ((fds[i] = open(argv[2 + i], O_WRONLY | O_CLOEXEC)) < 0) { perror(argv[2 + i]); return 1; }
  double t0 = now();
  for (int i = 0; i < n; i++) {
    int o[2], e[2], s[2];
    if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC) || pipe2(s, O_CLOEXEC)) { perror("pipe"); return 1; }
    pid_t p = fork();
    if (p == 0) {
      for (int j = 0; j < nf; j++)
        if (write(fds[j], "0", 1) != 1) _exit(99);
      setsid();
      dup2(o[1], 1);
      dup2(e[1], 2);
      execl("/bin/true", "true", (char *)0);
      _exit(127);
    }
    close(o[1]); close(e[1]); close(s[1]);
    char c;
    if (read(s[0], &c, 1) < 0) perror("read");
    close(s[0]);  // the rank's stdout/stderr pipes stay open, as a launcher's would
  }
  double t1 = now();
  for (int i = 0; i < n; i++) wait(NULL);
  printf("floor: %d x /bin/true, %d cgroup joins each: all exec'd after %.1f ms (%.0f/s)\n", n, nf, t1 - t0,
         n / ((t1 - t0) / 1e3));
  return 0;
}
