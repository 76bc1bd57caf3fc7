"""The numpy reference runtime: a readable forward pass that is the oracle for the native engine."""

from edgeflash.runtime.reference.model import ReferenceEngine

__all__ = ["ReferenceEngine"]
