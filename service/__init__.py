"""The accelerator daemon, in rooms whose arrows point down:

    ops/      the `hetserve` command, the server that assembles the rest, systemd
    clients/  what talks to a daemon from outside: top, tune, the load client, probes
    workers/  --workers N: front-end processes and the device owner's channel to them
    http/     KServe V2 over REST: JSON and binary tensors <-> the protocol's types, HTTP codes
    grpc/     KServe V2 over gRPC: messages <-> the protocol's types, statuses, token, limits
    protocol/ KServe V2 without a transport: its types, inputs, outputs, decoding, the operations
    edge/     what both transports and the workers share at the edge: doors, credentials, upload
              budgets, requests in flight, the access log, clients' shared memory
    core/     transport-neutral: repository, registry, scheduling, ranking, device runners

beside errors.py, settings.py with setting_names.py (flags and variables), daemon_log.py and
contract.py (what clients must agree on), unix_socket.py (the socket's folder and lock rules),
parent_death.py, and the client side, client_socket.py and local_daemon.py (finding, checking,
starting a node's daemon: all spark_jobs may use besides contract and errors), which every room
may import."""
