/* comm_split.c: sub-communicators of MPI_COMM_WORLD, each checked by every rank.
 *  - MPI_Comm_split by rank parity (color rank % 2) with key -rank (the sub-ranks run in
 *    reverse world order): its size, this rank's sub-rank and the MPI_Allreduce of the world
 *    ranks within it are what the parity says;
 *  - MPI_Comm_split with MPI_UNDEFINED for world rank 0: rank 0 gets MPI_COMM_NULL, the others
 *    one communicator of size - 1 whose allreduce of the world ranks is size*(size-1)/2;
 *  - MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): the ranks of this node, gathered in node-rank
 *    order (the test checks they are the ones per node and agree with each other).
 * Prints "comm_split ok rank=R color=C sub_rank=S sub_size=Z sum=X rest=Y node_size=N
 * node=A,B,..." (rest: the MPI_UNDEFINED split's sum, -1 for rank 0) or "comm_split bad
 * rank=R ..." naming the first wrong value; exits 1 if any. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int ok = 1;

    /* By parity, in reverse world order. */
    int color = rank % 2;
    MPI_Comm parity;
    MPI_Comm_split(MPI_COMM_WORLD, color, -rank, &parity);
    int sub_rank, sub_size;
    MPI_Comm_rank(parity, &sub_rank);
    MPI_Comm_size(parity, &sub_size);
    long mine = rank, sum = -1;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, parity);
    int want_size = 0, want_rank = 0;
    long want_sum = 0;
    for (int r = color; r < size; r += 2) {
        want_size++;
        want_sum += r;
        if (r > rank) {
            want_rank++;
        }
    }
    if (sub_size != want_size || sub_rank != want_rank || sum != want_sum) {
        printf("comm_split bad rank=%d parity sub_rank=%d/%d sub_size=%d/%d sum=%ld/%ld\n", rank, sub_rank,
               want_rank, sub_size, want_size, sum, want_sum);
        ok = 0;
    }
    MPI_Comm_free(&parity);

    /* Rank 0 left out. */
    MPI_Comm rest;
    MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 1, rank, &rest);
    long rest_sum = -1;
    if (rank == 0) {
        if (rest != MPI_COMM_NULL) {
            printf("comm_split bad rank=0 undefined color gave a communicator\n");
            ok = 0;
        }
    } else if (rest == MPI_COMM_NULL) {
        printf("comm_split bad rank=%d no communicator for color 1\n", rank);
        ok = 0;
    } else {
        int rest_size, rest_rank;
        MPI_Comm_size(rest, &rest_size);
        MPI_Comm_rank(rest, &rest_rank);
        MPI_Allreduce(&mine, &rest_sum, 1, MPI_LONG, MPI_SUM, rest);
        if (rest_size != size - 1 || rest_rank != rank - 1 || rest_sum != (long)size * (size - 1) / 2) {
            printf("comm_split bad rank=%d rest rank=%d size=%d sum=%ld\n", rank, rest_rank, rest_size, rest_sum);
            ok = 0;
        }
        MPI_Comm_free(&rest);
    }

    /* By node. */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int node_size;
    MPI_Comm_size(node, &node_size);
    int *members = malloc(sizeof(int) * (size_t)node_size);
    MPI_Allgather(&rank, 1, MPI_INT, members, 1, MPI_INT, node);
    int found = 0;
    for (int i = 0; i < node_size; i++) {
        found |= members[i] == rank;
        if (i > 0 && members[i] <= members[i - 1]) {
            printf("comm_split bad rank=%d node members out of key order\n", rank);
            ok = 0;
        }
    }
    if (!found) {
        printf("comm_split bad rank=%d not among its node's members\n", rank);
        ok = 0;
    }
    MPI_Comm_free(&node);

    if (ok) {
        printf("comm_split ok rank=%d color=%d sub_rank=%d sub_size=%d sum=%ld rest=%ld node_size=%d node=", rank,
               color, sub_rank, sub_size, sum, rest_sum, node_size);
        for (int i = 0; i < node_size; i++) {
            printf(i ? ",%d" : "%d", members[i]);
        }
        printf("\n");
    }
    fflush(stdout);
    free(members);
    MPI_Finalize();
    return ok ? 0 : 1;
}
