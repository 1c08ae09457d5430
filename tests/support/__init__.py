"""What the tests share: the example model and a daemon on ports it picks (daemon), numeric
checks (numerics), ONNX graphs and their checks against ONNX Runtime (onnx_graphs), the OpenCL
devices under test (opencl_devices), daemons served by the test engines (served, faulty_engine,
recording_engine), model folders (repository), metrics (metrics), waiting for a condition
(waiting), a second local user (other_user), the processes a test started (processes), Spark's
test configuration (spark), a Prometheus server over a daemon (prometheus_stack) and fake sysfs
files (sysfs). No test imports another test module or a conftest: the conftests hold fixtures
only."""
