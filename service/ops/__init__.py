"""Running the daemon: the `hetserve` command, the server that assembles transport, workers and
core, and systemd notification. May import every other room (the `hetserve` command reaches
tune, top and the probe in service.clients)."""
