"""The state diff reads every format the frameworks write: safetensors, numpy, JSON, torch files
with numpy inside, anything else as bytes; identical bytes are never a difference."""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from spotchaos.backends.subprocess import SubprocessBackend
from spotchaos.training.state.checkpoint_reader import ConfinedLoader, Confinement
from spotchaos.training.state.confined.state_diff import diff
from spotchaos.training.state.diff import compare


def kept(root, label, files: dict[str, bytes | object]):
    """A kept checkpoint folder ``a<attempt>-s<step>`` of files written in their own format."""
    folder = root / label
    folder.mkdir(parents=True)
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif name.endswith(".safetensors"):
            save_file(content, str(path), metadata={"format": "pt"})
        elif name.endswith(".npy"):
            np.save(path, content, allow_pickle=False)
        elif name.endswith(".json"):
            path.write_text(json.dumps(content))
        else:
            torch.save(content, path)
    return folder


def hf_rng_state(seed: int) -> dict:
    """What transformers' Trainer writes to rng_state.pth: numpy's RNG state (an array) inside a torch file."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}


def confined_loader(tmp_path, *readable):
    backend = SubprocessBackend()
    confinement = Confinement(
        env=backend.inherited_environment(), cwd=tmp_path, writable=(tmp_path,), readable=readable
    )
    return ConfinedLoader(backend, confinement, tmp_path)


def test_numpy_rng_state_in_a_torch_file_is_compared_in_the_confinement_not_an_error(tmp_path):
    ref, chaos = tmp_path / "ref.kept", tmp_path / "chaos.kept"
    kept(ref, "a0-s7", {"rng_state.pth": hf_rng_state(1)})
    kept(chaos, "a1-s7", {"rng_state.pth": hf_rng_state(2)})
    found = compare(ref, chaos, confined=confined_loader(tmp_path, ref, chaos))
    assert found is not None
    text = "; ".join(found.differences)
    assert "numpy.1: differs" in text and "cpu: differs" in text, text  # the MT19937 words, by their bytes
    assert "truth value" not in text


def test_byte_identical_files_are_never_a_difference_and_need_no_confined_helper(tmp_path):
    ref, chaos = tmp_path / "ref.kept", tmp_path / "chaos.kept"
    files = {
        "rng_state.pth": hf_rng_state(3),
        "model.safetensors": {"w": torch.arange(6.0).reshape(2, 3)},
        "blob.bin.raw": os.urandom(4096),
        "weights.npy": np.arange(10, dtype=np.float32),
    }
    kept(ref, "a0-s7", files)
    chaos_folder = chaos / "a1-s7"
    shutil.copytree(ref / "a0-s7", chaos_folder)
    loader = confined_loader(tmp_path, ref, chaos)
    assert compare(ref, chaos, confined=loader) is None
    assert loader.runs == 0  # nothing was parsed, let alone unpickled


def test_safetensors_are_read_tensor_by_tensor_with_their_metadata(tmp_path):
    ref, chaos = tmp_path / "ref.kept", tmp_path / "chaos.kept"
    w = torch.arange(6.0).reshape(2, 3)
    kept(ref, "a0-s3", {"model.safetensors": {"w": w, "b": torch.zeros(3)}})
    kept(chaos, "a1-s3", {"model.safetensors": {"w": w + 1, "b": torch.zeros(3)}})
    found = compare(ref, chaos, confined=None)
    assert found is not None and found.differences == ["w: differs"], found


def test_npy_arrays_and_unparseable_files_are_compared_without_error(tmp_path):
    ref, chaos = tmp_path / "ref.kept", tmp_path / "chaos.kept"
    kept(ref, "a0-s3", {"state.npy": np.arange(4), "opaque.dat": b"\x00" * 64, "model.safetensors": b"\x01" * 8})
    kept(
        chaos,
        "a1-s3",
        {"state.npy": np.arange(4) * 2, "opaque.dat": b"\x00" * 63 + b"\x01", "model.safetensors": b"\x02" * 8},
    )
    found = compare(ref, chaos, confined=None)
    assert found is not None
    assert set(found.differences) == {
        "state.npy:(value): differs",
        "opaque.dat:(bytes): differs",
        "model.safetensors:(bytes): differs",  # not a whole safetensors file: its bytes differ
    }, found.differences


@pytest.mark.unit
def test_paths_of_each_run_own_directory_compare_equal():
    reference = {"dirpath": "/runs/a/ckpt", "best_k_models": {"/runs/a/ckpt/e1.ckpt": 0.5}, "other": "/elsewhere"}
    chaos = {"dirpath": "/runs/b/ckpt", "best_k_models": {"/runs/b/ckpt/e1.ckpt": 0.5}, "other": "/elsewhere"}
    assert diff(reference, chaos, 10, runs=("/runs/a", "/runs/b"))["differences"] == []
    differences = {d["entry"] for d in diff(reference, chaos, 10)["differences"]}
    assert differences == {"dirpath", "best_k_models./runs/a/ckpt/e1.ckpt", "best_k_models./runs/b/ckpt/e1.ckpt"}


@pytest.mark.unit
def test_numpy_values_are_compared_by_dtype_shape_and_bytes():
    a = {"numpy": ("MT19937", np.arange(5, dtype=np.uint32), 3), "scale": np.float32(1.5)}
    assert diff(a, {"numpy": ("MT19937", np.arange(5, dtype=np.uint32), 3), "scale": np.float32(1.5)}, 10) == {
        "differences": [],
        "more": 0,
    }
    b = {"numpy": ("MT19937", np.arange(5, dtype=np.uint64), 3), "scale": np.float32(2.5)}
    shown = {d["entry"]: (d["reference"], d["chaos"]) for d in diff(a, b, 10)["differences"]}
    assert shown == {"numpy.1": ("uint32 (5,)", "uint64 (5,)"), "scale": ("1.5", "2.5")}


@pytest.mark.unit
def test_checkpoints_built_to_exhaust_the_harness_are_refused_before_they_are_parsed(tmp_path):
    """An .npz whose member inflates 1000-fold (a zip bomb) and a safetensors file declaring a
    90 MB header are compared as bytes, with the bound named, without inflating or parsing them."""
    import zipfile

    from spotchaos.training.state.formats import AsBytes, load_state

    bomb = tmp_path / "state.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, dtype=np.uint8))
    header["shape"] = (1 << 30,)  # 1 GiB of zeros, deflated to about a megabyte
    with (
        zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive,
        archive.open("x.npy", "w", force_zip64=True) as member,
    ):
        np.lib.format.write_array_header_1_0(member, header)
        block = bytes(1 << 24)
        for _ in range(64):
            member.write(block)
    assert bomb.stat().st_size < 4 << 20
    big_header = tmp_path / "model.safetensors"
    with open(big_header, "wb") as f:
        f.write((90 << 20).to_bytes(8, "little") + b'{"__metadata__": {"a": "' + b"x" * 1024)
    with pytest.raises(AsBytes, match=r"inflate to 1,073,741,\d+ bytes .* over the bound"):
        load_state(bomb)
    with pytest.raises(AsBytes, match=r"header of 94,371,840 bytes is over the 8 MiB bound"):
        load_state(big_header)
