"""Running the daemon: the `hetserve` command, the server that assembles transport, workers and
core, `hetserve top`, `hetserve tune` with the load client and local daemons it shares with the
benchmarks, systemd notification and health probes. May import every other room."""
