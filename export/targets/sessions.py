"""One loaded chunk file per target runtime, called as `run(method, inputs) -> outputs` (numpy)."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
from edgeflash.base.errors import UserError


class ExecuTorchSession:
    """A `.pte` through `executorch.runtime`; methods load on first use."""

    def __init__(self, path: Path, threads: int):
        # Registers the portable kernels of the quantized embedding ops (embedding_4bit/_byte).
        import executorch.kernels.quantized  # noqa: F401
        import torch
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        self.torch = torch
        portable_lib._unsafe_reset_threadpool(threads)  # one pool per process, shared by every program
        self.program = Runtime.get().load_program(str(path))
        self.methods = {}

    def run(self, method: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        m = self.methods.get(method)
        if m is None:
            m = self.methods[method] = self.program.load_method(method)
        outputs = m.execute([self.torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
        return [o.numpy() for o in outputs]


class OnnxSession:
    """An `.onnx` file through onnxruntime (CPU); prefill and decode are the same graph."""

    def __init__(self, path: Path, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def run(self, method: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, dict(zip(self.names, inputs)))


class CoreMLSession:
    """An `.mlpackage` through Core ML, which exists on macOS only."""

    def __init__(self, path: Path):
        if platform.system() != "Darwin":
            raise UserError(f"{path}: Core ML runs models on macOS only (this is {platform.system()})")
        import coremltools as ct

        self.path = path
        self.models: dict[str, object] = {}
        self.state = None
        self.ct = ct

    def run(self, method: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        model = self.models.get(method)
        if model is None:
            model = self.models[method] = self.ct.models.MLModel(str(self.path), function_name=method)
        if self.state is None:
            self.state = model.make_state()  # both functions share the cache states
        names = [i.name for i in model.get_spec().description.input]
        out = model.predict(dict(zip(names, inputs)), state=self.state)
        order = [o.name for o in model.get_spec().description.output]
        return [np.asarray(out[name]) for name in order]
