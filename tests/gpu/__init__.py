"""What only a GPU shows: placement of workers on CUDA devices, a real
out-of-memory error, the examples on CUDA, a GPU that another process holds.
Every test here carries the ``gpu`` marker and is skipped, with the reason,
where torch sees no CUDA device (CI has none): ``python -m bench.gpu_report``
runs them on a GPU box and writes what it found."""
