"""The machine: what this host is and what its kernels cost.

capability (the CPU class), platform (this machine's identity, the baselines' key), kernels (the
int8 GEMM behind each precision and its cost at M tokens), hostspeed (the host probe), affinity
(pinning a process to a core), predict (the speedup step costs predict) and provenance (where a
result came from: commit, platform, software). May import: core.
"""
