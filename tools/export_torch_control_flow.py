"""Write tests/data/torch_control_flow.onnx: a small recurrent model with data-dependent
control flow, scripted with ``torch.jit.script`` and exported by torch's TorchScript-based
exporter, as deployed models with loops are (a Loop whose trip count is the input's time
length, a data-dependent If on its result).

Run once, where torch is installed (``pip install -e ".[zoo]"``): ``python
tools/export_torch_control_flow.py``. The test suite reads the committed file and never needs
torch. The weights are random (seed 0).
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import onnx
import torch

TARGET = Path(__file__).resolve().parents[1] / "tests" / "data" / "torch_control_flow.onnx"
FEATURES = 8


class Recurrent(torch.nn.Module):
    """h = tanh(W x_t + b + h) over the time axis, then 2h where the sum of h is positive,
    h - 1 elsewhere; returns that and h."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(x.shape[0], self.cell.out_features)
        for t in range(x.shape[1]):
            h = torch.tanh(self.cell(x[:, t]) + h)
        y = h * 2 if bool(h.sum() > 0) else h - 1  # exported as an If node
        return y, h


def main() -> int:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script and this exporter are deprecated
        scripted = torch.jit.script(Recurrent())
        buffer = io.BytesIO()
        torch.onnx.export(scripted, (torch.randn(2, 5, FEATURES),), buffer, dynamo=False,
                          input_names=["x"], output_names=["y", "h"],
                          dynamic_axes={"x": {0: "batch", 1: "time"}}, opset_version=17)
    model = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(model)
    onnx.save(model, TARGET)
    print(f"{TARGET}: {TARGET.stat().st_size} bytes, nodes "
          f"{[node.op_type for node in model.graph.node]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
