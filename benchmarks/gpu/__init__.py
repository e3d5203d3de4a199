"""The parts of benchmarks/bench_gpu.py: the environment record, the child processes (with
timeouts and error tails), kt-train's operating point and the training and decoding rows."""
