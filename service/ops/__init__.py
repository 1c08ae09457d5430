"""Running the daemon: the `hetserve` command, the server that assembles transport, workers and
core, `hetserve top`, systemd notification and health probes. May import every other room."""
