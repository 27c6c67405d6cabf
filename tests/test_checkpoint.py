"""aiayn.checkpoint: loading weights, including those of older checkpoints."""

import json
import re
import shutil

import torch
from safetensors.torch import load_file, save_file

from aiayn.checkpoint import WEIGHTS, load_transformer


def test_a_checkpoint_with_the_old_sublayer_norm_names_loads_into_the_named_norms(
    tiny_run, tmp_path
):
    """Checkpoints written before norms were named by role (``encoder.0.sublayer.1.norm``) load
    to the same model: every tensor lands on its role's norm, none is left at its initial value."""
    ckpt = sorted((tiny_run / "checkpoints").glob("update_*"))[-1]
    old = tmp_path / "old"
    shutil.copytree(ckpt, old)
    state = load_file(str(old / WEIGHTS))
    roles = {"self_attn_norm": 0, "src_attn_norm": 1, "ffn_norm": None}
    legacy = {}
    for key, tensor in state.items():
        m = re.match(
            r"(encoder|decoder)\.(\d+)\.(self_attn_norm|src_attn_norm|ffn_norm)\.(.*)", key
        )
        if m:
            stack, layer, role, kind = m.groups()
            index = roles[role] if role != "ffn_norm" else (1 if stack == "encoder" else 2)
            key = f"{stack}.{layer}.sublayer.{index}.norm.{kind}"
        legacy[key] = tensor
    assert any(".sublayer.2.norm." in k for k in legacy), sorted(legacy)
    # distinct values per norm, so a norm loaded from the wrong sub-layer would show
    for i, key in enumerate(k for k in sorted(legacy) if ".norm." in k):
        legacy[key] = torch.full_like(legacy[key], float(i + 2))
    save_file(legacy, str(old / WEIGHTS), metadata={"format": "pt"})

    model, _ = load_transformer(old)
    got = model.state_dict()
    for key, tensor in legacy.items():
        m = re.match(r"(encoder|decoder)\.(\d+)\.sublayer\.(\d)\.norm\.(.*)", key)
        if not m:
            continue
        stack, layer, index, kind = m.groups()
        role = {
            ("encoder", "0"): "self_attn_norm",
            ("encoder", "1"): "ffn_norm",
            ("decoder", "0"): "self_attn_norm",
            ("decoder", "1"): "src_attn_norm",
            ("decoder", "2"): "ffn_norm",
        }[stack, index]
        assert torch.equal(got[f"{stack}.{layer}.{role}.{kind}"], tensor), key
    assert json.loads((old / "meta.json").read_text())  # the copy is a full checkpoint
