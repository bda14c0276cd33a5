"""What several benchmarks share: the workloads W1-W3 (:mod:`.workloads`), the runners of the throughput
suite's peers (:mod:`.peers`), emulated accelerators (:mod:`.emulated`) and the time-to-accuracy
tasks (:mod:`.accuracy_tasks`).  Import the module you need; this package imports nothing."""
