"""The OpenCL engine: hetserve's own kernels (kernels/*.cl) running ONNX graphs on FPGA, GPU and
CPU OpenCL devices."""
