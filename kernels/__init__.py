"""OpenCL C sources (`*.cl`) of hetserve's kernels, shipped as package data, and the recipes
that build them into FPGA binaries."""
