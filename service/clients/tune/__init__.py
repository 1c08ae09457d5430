"""`hetserve tune`: sweeps a model's devices, instance counts, queue delay and preferred batch
sizes through real daemons and writes the best config for an objective. Part of ops: may import
every room below it, accelerators, and ops' own load client and daemon runner."""
