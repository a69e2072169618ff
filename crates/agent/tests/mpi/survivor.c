/* A fault-aware MPI program for `--no-kill` jobs: after a first allreduce the ranks work
 * independently for SECS seconds (nodes may fail meanwhile), then each survivor reads the
 * launcher's notification file (BERTH_FAILED_RANKS: one line per failed rank) and finalizes. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int count_failed(void) {
    const char *path = getenv("BERTH_FAILED_RANKS");
    if (!path) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int one = 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d: started with %d ranks\n", rank, sum);
    fflush(stdout);
    int secs = argc > 1 ? atoi(argv[1]) : 10;
    for (int i = 0; i < secs * 10; i++) usleep(100000);
    printf("rank %d: survived; %d failed ranks reported\n", rank, count_failed());
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
