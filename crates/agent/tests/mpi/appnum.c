/* appnum.c: for MPMD steps. Every rank prints its MPI_APPNUM, its rank and size in
 * MPI_COMM_WORLD, the size of its program's part (MPI_Comm_split by appnum), its first
 * argument, and two MPI_Allreduce results over MPI_COMM_WORLD (so the parts talk): the sum of
 * the ranks and the number of ranks of program 0. Exits 1 if MPI_APPNUM is missing or the
 * sum is wrong. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, flag = 0, *attr = NULL, appnum = -1, part_size = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &attr, &flag);
    if (flag && attr != NULL) {
        appnum = *attr;
    }
    MPI_Comm part;
    MPI_Comm_split(MPI_COMM_WORLD, appnum < 0 ? 0 : appnum, rank, &part);
    MPI_Comm_size(part, &part_size);
    long mine[2] = {rank, appnum == 0 ? 1 : 0}, sum[2] = {0, 0};
    MPI_Allreduce(mine, sum, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long expected = (long) size * (size - 1) / 2;
    printf("appnum rank=%d size=%d app=%d part=%d arg=%s sum=%ld expected=%ld app0=%ld\n", rank, size, appnum,
           part_size, argc > 1 ? argv[1] : "-", sum[0], expected, sum[1]);
    fflush(stdout);
    MPI_Comm_free(&part);
    MPI_Finalize();
    return flag && sum[0] == expected ? 0 : 1;
}
