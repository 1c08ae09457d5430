"""The transport-neutral core: model specs and the repository, each model's settings (parsed once
from config.pbtxt: model_settings, engine_settings), the registry of loaded models, the scheduler
(queue policy, batching, the device and thread a batch runs on), the ranking of devices, device
runners, batch buffers and buckets, warm-up, statistics and metrics. Imports only service's own
errors, settings and contract, and accelerators/."""
