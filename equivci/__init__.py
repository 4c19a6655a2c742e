"""equivci: prove sharded JAX programs equivalent to their single-device reference."""

__version__ = "0.1.0"
