"""Tensor parallelism across processes (boards): each rank holds a share of every layer's heads and
FFN neurons and of the vocabulary rows, under its own memory budget, and the ranks complete each
layer's partial sums with MPI all-reduces. docs/scale-out.md has the usage and the cost model."""
