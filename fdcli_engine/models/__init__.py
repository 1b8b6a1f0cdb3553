"""Model implementations, one file per architecture; `registry` maps config architectures to them."""

from fdcli_engine.models.registry import MODEL_REGISTRY, resolve_model_class, supported_architectures

__all__ = ["MODEL_REGISTRY", "resolve_model_class", "supported_architectures"]
