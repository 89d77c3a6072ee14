"""strata: exact speculative decoding and expert streaming for Qwen3-Next GGUF models.

    from strata_py import Model, generate
    model = Model.load()                      # the shipped default model
    for piece in generate(model, "def parse_args(", max_tokens=64):
        print(piece, end="")

The C++ core (`strata_py._core`) is imported lazily so that pure-Python tools (the converter, the
tokenizer) work before the extension is built.
"""
from __future__ import annotations

from .config import GenerationConfig

__all__ = ["Model", "Session", "GenerationConfig", "generate"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in ("Model", "Session"):
        from . import model as _model
        return getattr(_model, name)
    if name == "generate":
        # the module strata_py.generate (the CLI) is itself callable as generate(model, prompt, **options)
        import importlib
        return importlib.import_module(".generate", __name__)
    raise AttributeError(f"module 'strata_py' has no attribute {name!r}")
