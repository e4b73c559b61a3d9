"""Bytes per element of each storage type: the only place these sizes are written."""

BYTES_PER_ELEMENT = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "bool": 1,   # PyTorch stores a bool (e.g. a dropout mask on CUDA) in one byte
}


def nbytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``"bf16"`` -> 2); ``ValueError`` if unknown."""
    try:
        return BYTES_PER_ELEMENT[dtype]
    except KeyError:
        known = ", ".join(BYTES_PER_ELEMENT)
        raise ValueError(f"unknown dtype {dtype!r}; known: {known}") from None
