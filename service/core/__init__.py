"""The transport-neutral core: model specs and the repository, the registry of loaded models,
batching (queue policy, buckets, buffers), routing to device runners, warm-up, statistics and
metrics. Imports only service's own errors, settings and contract, and accelerators/."""
