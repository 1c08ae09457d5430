"""The accelerator daemon, in rooms whose arrows point down:

    ops/      the `hetserve` command, the server that assembles the rest, systemd
    clients/  what talks to a daemon from outside: top, tune, the load client, probes
    workers/  --workers N: front-end processes and the device owner's channel to them
    http/     KServe V2 over REST, on the gRPC servicer and its doors
    grpc/     the KServe V2 / Triton transport: servicer, codecs, shared memory, auth, doors
    core/     transport-neutral: repository, registry, scheduling, ranking, device runners

beside errors.py, settings.py with setting_names.py (flags and variables), daemon_log.py and
contract.py (what clients must agree on), unix_socket.py (the socket's folder and lock rules),
parent_death.py, and the client side, client_socket.py and local_daemon.py (finding, checking,
starting a node's daemon: all spark_jobs may use besides contract and errors), which every room
may import."""
