/* abort.c: after a fence rank 1 calls PMI2_Abort with the message MPICH's MPI_Abort(comm, 7)
 * would give (libpmi2 then exits by itself); the other ranks sleep 30 s, so that the launcher
 * has to kill them. */
#include <slurm/pmi2.h>
#include <stdio.h>
#include <unistd.h>

int main(void)
{
    int spawned, size, rank, appnum, i;
    if (PMI2_Init(&spawned, &size, &rank, &appnum) != PMI2_SUCCESS || PMI2_KVS_Fence() != PMI2_SUCCESS)
        return 2;
    if (rank == 1) {
        printf("rank 1 aborting\n");
        fflush(stdout);
        PMI2_Abort(1, "application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1");
    }
    for (i = 0; i < 30; i++)
        sleep(1);
    printf("rank %d was not killed\n", rank);
    fflush(stdout);
    PMI2_Finalize();
    return 0;
}
