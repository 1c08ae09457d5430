"""The FPGA pipeline (kernels/fpga/pipeline.cl): board profiles, the lowering of a model onto it,
binary manifests, the hardware model and `hetserve fpga`. Imports accelerators.opencl's graph,
launch and program types; nothing from service."""
