/* abort.c: after a barrier rank 1 calls MPI_Abort(MPI_COMM_WORLD, 7); the other ranks sleep
 * 30 s without calling MPI, so that the launcher has to kill them. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, i;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        printf("rank 1 aborting\n");
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 7);
    }
    for (i = 0; i < 30; i++)
        sleep(1);
    printf("rank %d was not killed\n", rank);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
