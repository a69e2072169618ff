/* locality.c: how Open MPI sees its ranks' locality, from what the launcher said of their
 * binding (PMIX_LOCALITY_STRING): the sizes of MPI_COMM_WORLD split by node, by package
 * (OMPI_COMM_TYPE_SOCKET) and by core (OMPI_COMM_TYPE_CORE):
 *   "locality rank=R node=N socket=S core=C"
 * Without locality data Open MPI knows only that its peers share the node: socket and core
 * are then 1. Under another MPI (no OMPI_COMM_TYPE_*): "locality rank=R unsupported". */
#include <mpi.h>
#include <stdio.h>

#if defined(OPEN_MPI) && OPEN_MPI
static int split_size(int type)
{
    MPI_Comm c;
    int n = -1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, type, 0, MPI_INFO_NULL, &c) == MPI_SUCCESS && c != MPI_COMM_NULL) {
        MPI_Comm_size(c, &n);
        MPI_Comm_free(&c);
    }
    return n;
}
#endif

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#if defined(OPEN_MPI) && OPEN_MPI
    int node = split_size(MPI_COMM_TYPE_SHARED);
    int socket = split_size(OMPI_COMM_TYPE_SOCKET);
    int core = split_size(OMPI_COMM_TYPE_CORE);
    printf("locality rank=%d node=%d socket=%d core=%d\n", rank, node, socket, core);
#else
    printf("locality rank=%d unsupported\n", rank);
#endif
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
