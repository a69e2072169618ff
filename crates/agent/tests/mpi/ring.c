/* ring.c: a token goes around the ring LAPS times, each rank adding 1; rank 0 checks it. */
#include <mpi.h>
#include <stdio.h>

#define LAPS 10

int main(int argc, char **argv)
{
    int rank, size, lap;
    long token = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (lap = 0; lap < LAPS; lap++) {
        if (rank == 0) {
            token++;
            MPI_Send(&token, 1, MPI_LONG, next, lap, MPI_COMM_WORLD);
            MPI_Recv(&token, 1, MPI_LONG, prev, lap, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&token, 1, MPI_LONG, prev, lap, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            token++;
            MPI_Send(&token, 1, MPI_LONG, next, lap, MPI_COMM_WORLD);
        }
    }
    int ok = 1;
    if (rank == 0) {
        ok = token == (long) LAPS * size;
        if (ok)
            printf("ring ok laps=%d token=%ld\n", LAPS, token);
        else
            printf("ring bad laps=%d token=%ld expected=%ld\n", LAPS, token, (long) LAPS * size);
        fflush(stdout);
    }
    MPI_Finalize();
    return ok ? 0 : 1;
}
