"""Interface discovery: what a served model takes and gives (input, outputs, batch sizes,
priority levels, image parameters), read once on the driver from the daemon's model config."""

from __future__ import annotations

from dataclasses import dataclass, field

from service import contract
from spark_jobs.credentials import NO_CREDENTIALS, Credentials

# Where a model's config.pbtxt says how to turn 8-bit images into its input (see docs/spark.md).
IMAGE_PARAMETERS = ("image_mean", "image_std", "image_channel_order")


@dataclass(frozen=True)
class ModelInterface:
    """What a job needs to know of a served model, read once on the driver."""

    name: str
    input_name: str
    input_datatype: str
    input_dims: tuple[int, ...]  # one sample's shape
    output_name: str
    max_batch_size: int
    priority_levels: int = 0
    image: dict[str, str] = field(default_factory=dict)  # the IMAGE_PARAMETERS it sets
    preferred_batch_sizes: tuple[int, ...] = ()  # dynamic_batching.preferred_batch_size
    # The output's, as replies must carry it (None, in an interface built by hand: unchecked).
    output_datatype: str | None = None
    output_dims: tuple[int, ...] | None = None  # one sample's shape, -1 for any size
    # Every output of the config, (name, datatype, one sample's dims), for the raw output mode.
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

    @classmethod
    def fetch(cls, address: str, model: str, credentials: Credentials = NO_CREDENTIALS,
              timeout_s: float = 60.0) -> ModelInterface:
        client, headers = credentials.connect(address)
        try:
            config = client.get_model_config(model, headers=headers,
                                             client_timeout=timeout_s).config
        finally:
            client.close()
        if config.max_batch_size < 1 or len(config.input) != 1 or not config.output:
            raise ValueError(f"model {model!r}: scoring needs one batched input and an output; "
                             f"max_batch_size is {config.max_batch_size}, "
                             f"inputs are {[i.name for i in config.input]}")
        tensor, output = config.input[0], config.output[0]
        image = {k: config.parameters[k].string_value
                 for k in IMAGE_PARAMETERS if k in config.parameters}
        return cls(model, tensor.name, contract.wire_from_config(tensor.data_type),
                   tuple(tensor.dims), output.name, config.max_batch_size,
                   config.dynamic_batching.priority_levels, image,
                   tuple(config.dynamic_batching.preferred_batch_size),
                   contract.wire_from_config(output.data_type), tuple(output.dims),
                   tuple((o.name, contract.wire_from_config(o.data_type), tuple(o.dims))
                         for o in config.output))

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """The batch sizes the daemon runs its engines at (it pads a batch to the next one)."""
        return contract.batch_buckets(self.max_batch_size, self.preferred_batch_sizes)

    def request_batch(self, wanted: int | None = None) -> int:
        """Samples per request: the largest bucket, or the largest not above `wanted`, so that
        full requests fill a bucket exactly and the daemon pads none of them."""
        fits = [b for b in self.batch_buckets if wanted is None or b <= wanted]
        return max(fits, default=max(1, wanted or 1))

    @property
    def lowest_priority(self) -> int:
        """Triton's priority levels count from 1 (highest); 0 asks for the default level."""
        return self.priority_levels

    def level(self, priority: int | None) -> int:
        """The level requests go at: `priority`, else the model's lowest."""
        return self.lowest_priority if priority is None else priority
