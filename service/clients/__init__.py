"""Tools that talk to a daemon from outside, as any client would: `hetserve tune` (and the load
client and perf_analyzer driver it measures with), `hetserve top`, the health probe, and the
figures and labels they share with the benchmarks. Imports the shared modules, core's model
repository and accelerators' device inventory; never service.ops, workers, http or grpc."""
