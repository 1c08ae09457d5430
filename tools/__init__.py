"""Scripts and helpers kept out of the wheel: the digits, the benchmark architectures, the demo."""
