"""The accelerator daemon, in rooms whose arrows point down:

    ops/      the `hetserve` command, the server that assembles the rest, top, systemd
    workers/  --workers N: front-end processes and the device owner's channel to them
    grpc/     the KServe V2 / Triton transport: servicer, codecs, shared memory, auth
    core/     transport-neutral: repository, registry, batching, routing, device runners

beside errors.py, settings.py and contract.py (what clients must agree on), unix_socket.py
(the socket's folder and lock rules), parent_death.py, and the client side, client_socket.py and
local_daemon.py (finding, checking, starting a node's daemon: all spark_jobs may use besides
contract and errors), which every room may import."""
