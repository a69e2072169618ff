/* allreduce.c: MPI_Allreduce of the ranks; exits 1 if the sum is wrong. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size;
    long sum = 0, mine;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mine = rank;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long expected = (long) size * (size - 1) / 2;
    printf("allreduce sum=%ld expected=%ld\n", sum, expected);
    fflush(stdout);
    MPI_Finalize();
    return sum == expected ? 0 : 1;
}
