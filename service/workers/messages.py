"""The messages between a front-end process and the device owner: one type per kind, encoded as
MessagePack arrays by msgspec (a tenth of the cost of JSON dictionaries:
bench/channel_messages.py). Each frame of the channel (service/workers/owner_channel.py) holds
one message and a payload of bytes where the kind says so. Nothing is unpickled.

A request's id is the front-end's; the owner answers each Infer, Stats, Register, Unregister,
Load and Unload exactly once, by id. Errors travel as (status, message)."""

from __future__ import annotations

import msgspec

from service.protocol.types import ModelStatistics

# (name, numpy dtype string, shape, offset in the arena, bytes) of a request's input.
InputPlace = tuple[str, str, tuple[int, ...], int, int]
# (name, numpy dtype string, shape, bytes) of an output in a Reply's payload.
OutputPlace = tuple[str, str, tuple[int, ...], int]


# Each kind repeats frozen=True: msgspec inherits it from here, mypy does not.
class _Message(msgspec.Struct, tag=True, array_like=True, frozen=True):
    pass


# front-end -> owner
class Infer(_Message, frozen=True):
    """A request, validated by the front-end: its inputs lie in the front-end's arena."""

    id: int
    model: str
    version: int  # 0: the latest, whichever it is when the owner takes the request
    generation: int  # the load of the model it was validated against (Catalog.generations)
    size: int  # rows on the batch axis
    inputs: list[InputPlace]
    priority: int
    timeout_us: int
    deadline: float | None  # time.monotonic() (one clock for the node's processes)
    caller: str  # whose queue places it takes (RequestOptions)
    anonymous: bool


class Cancel(_Message, frozen=True):
    """The client of request `id` has gone: withdraw it (it is still answered)."""

    id: int


class Stats(_Message, frozen=True):
    id: int
    name: str
    version: str


class Listening(_Message, frozen=True):
    """The front-end's gRPC server has started."""


class Register(_Message, frozen=True):
    """A client registers a shared memory region at this front-end: the owner reserves its name
    for every front-end, or answers why not."""

    id: int
    name: str
    key: str
    offset: int
    byte_size: int
    caller: str
    uid: int  # the caller's rights, which each front-end judges the object by
    gids: tuple[int, ...]


class Unregister(_Message, frozen=True):
    """A client releases its region `name` (all of its regions for an empty name)."""

    id: int
    name: str
    caller: str


class Load(_Message, frozen=True):
    """RepositoryModelLoad, from a caller the front-end let: the owner answers Done once every
    front-end has been sent the catalog it made, or Failed."""

    id: int
    name: str
    parameters: list[str]  # the names of the request's parameters


class Unload(_Message, frozen=True):
    """RepositoryModelUnload, answered as Load is."""

    id: int
    name: str


# owner -> front-end
class Loading(_Message, frozen=True):
    """The owner's first word while it loads models."""


class Catalog(_Message, frozen=True):
    """The served models, sent again whenever they change; the payload holds their ModelConfig
    messages, of `sizes` bytes."""

    versions: list[int]
    generations: list[int]  # which load of its model each one is
    sizes: list[int]
    labels: list[dict[str, list[str]]]  # each one's outputs' class labels
    minimums: list[dict[str, dict[int, int]]]  # each one's ModelSpec.minimums
    failures: dict[str, str]  # model name -> why it is not served


class Reply(_Message, frozen=True):
    """A request's outputs, in the payload in the order listed, and its cost (Cost's fields)."""

    id: int
    device: str
    outputs: list[OutputPlace]
    joules: float
    power_source: str
    flops: int
    flops_unknown_ops: list[str]  # Cost's: the op types the count leaves out


class Failed(_Message, frozen=True):
    id: int
    status: str  # a service.errors.Status name
    message: str


class Statistics(_Message, frozen=True):
    id: int
    models: list[ModelStatistics]  # the protocol's, as every transport answers them


class Done(_Message, frozen=True):
    """Register or Unregister `id` is done at every other front-end; Load or Unload `id` is done,
    and every front-end has been sent the new catalog."""

    id: int


class Registered(_Message, frozen=True):
    """A region registered at another front-end."""

    name: str
    key: str
    offset: int
    byte_size: int
    caller: str
    uid: int  # the caller's rights, which each front-end judges the object by
    gids: tuple[int, ...]


class Released(_Message, frozen=True):
    """Regions unregistered at another front-end."""

    names: list[str]


ForDaemon = Register | Unregister | Load | Unload  # what the owner does for every front-end
ToOwner = Infer | Cancel | Stats | Listening | Register | Unregister | Load | Unload
ToFrontend = Loading | Catalog | Reply | Failed | Statistics | Done | Registered | Released
