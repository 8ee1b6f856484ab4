"""The real-world PyTorch / safetensors corpus (shared/realworld/torch, see its MANIFEST.md):
every item reads as the MANIFEST describes it, or is refused naming the global it would call.
Skips cleanly where the corpus is absent."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
from click.testing import CliRunner

import ckptinspect
from ckptinspect.cli import app

runner = CliRunner()
WHOLE_MODEL_HINT = "this is a whole model saved with torch.save(model): save model.state_dict() instead"

# path -> (the global named, whether the whole-model hint is given)
REFUSED = {
    "legacy-torch03-whole-sequential/net.pkl": ("torch.nn.modules.container.Sequential", True),
    # the user's class (__main__.Tudui, model.Tudui) is an inert stand-in; the torch modules refuse
    "zip-whole-module-custom-class/tudui_method1.pth": ("torch.nn.modules.conv.Conv2d", True),
    "zip-whole-module-custom-class/tudui_0.pth": ("torch.nn.modules.container.Sequential", True),
}
# Issue 25 item 5: globals outside the allow-list that run no code are inert stand-ins; the file
# reads, and ls names what torch.load(weights_only=True) would need. path -> (first need, a
# variable read through the stand-ins, its shape)
STAND_INS = {
    "lightning-lstm-fn-hparam/checkpoints/last.ckpt": (
        "torch.nn.functional.binary_cross_entropy", "state_dict/linear.weight", (1, 1)),
    "hf-trainer-peft-lora-checkpoint/rng_state.pth": ("numpy._core.multiarray._reconstruct", "numpy/1", (624,)),
    "hf-trainer-peft-lora-checkpoint/training_args.bin": (
        "transformers.training_args.TrainingArguments", "_n_gpu", ()),
}
READABLE = [
    "zip-train-dict-rnn-adam/Test_files/checkpoints/checkpoint_epoch_199.pth",
    "zip-cnn-bn-statedict/model.pt",
    "legacy-udacity-mlp-dict/checkpoint.pth",
    "legacy-torch03-whole-sequential/net_params.pkl",
    "hf-trainer-peft-lora-checkpoint/adapter_model.safetensors",
    "hf-trainer-peft-lora-checkpoint/scheduler.pt",
    "hf-tiny-gpt2-safetensors/model/model.safetensors",
    "hf-bin-tiny-distilbert-legacy/tests/data/pytorch_model.bin",
    "zip-toplevel-tensor/tests/data/new_pytorch_model.bin",
    "safetensors-unaligned-header/models/Lora/EasyNegative.safetensors",
    "zip-a1111-textual-inversion/embeddings/bad-hands-5.pt",
    "safetensors-tinygrad-writer/model.safetensors",
    "safetensors-user-metadata-no-format/model.safetensors",
]


@pytest.fixture(scope="module")
def corpus(realworld) -> pathlib.Path:
    folder = realworld / "torch"
    if not (folder / "MANIFEST.md").is_file():
        pytest.skip(f"no torch corpus under {realworld}")
    return folder


def shapes(ckpt) -> dict[str, tuple[int, ...]]:
    return {v.key: v.shape for v in ckpt.variables}


@pytest.mark.parametrize("item", sorted(REFUSED))
def test_refused_naming_the_global(item, corpus):
    path = corpus / item
    name, hint = REFUSED[item]
    with pytest.raises(ckptinspect.UnsafeFileError) as e:
        ckptinspect.open(path)
    message = str(e.value)
    assert message.startswith(f"{path}: refusing to unpickle: it would call {name}, "), message
    assert (WHOLE_MODEL_HINT in message) == hint
    for args in (["ls", str(path)], ["verify", str(path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and result.stderr == f"Error: {message}\n"


@pytest.mark.parametrize("item", sorted(STAND_INS))
def test_stand_ins_read_and_name_their_globals(item, corpus):
    path = corpus / item
    need, key, shape = STAND_INS[item]
    with ckptinspect.open(path) as ckpt:
        assert ckpt.info["needs"][0] == need
        var = next(v for v in ckpt.variables if v.key == key)
        assert var.shape == shape and ckpt.read(var).shape == shape
    result = runner.invoke(app, ["ls", str(path)])
    assert result.exit_code == 0 and result.stderr.startswith(f"warning: needs: {need}"), result.stderr


@pytest.mark.parametrize("item", READABLE)
def test_reads_whole_and_finite(item, corpus):
    path = corpus / item
    with ckptinspect.open(path) as ckpt:
        for v in ckpt.variables:
            value = ckpt.read(v)
            assert value.shape == v.shape and str(value.dtype) == v.dtype, v.key
            if value.dtype.kind == "f":
                assert np.isfinite(value).all(), v.key
    result = runner.invoke(app, ["verify", str(path)])
    assert result.exit_code == 0, result.output


def test_training_dict_rnn_adam(corpus):
    with ckptinspect.open(corpus / READABLE[0]) as ckpt:
        assert ckpt.format == "torch-zip" and ckpt.info["zip_root"] == "checkpoint_epoch_199"
        # an epoch is the checkpoint's number, not a training step (the step rule)
        assert (ckpt.step, ckpt.number, ckpt.number_source) == (None, 199, "variable:epoch")
        model = [v for v in ckpt.variables if v.role == "model"]
        assert len(model) == 6 and all(v.key.startswith("model_state_dict/") for v in model)
        assert shapes(ckpt)["model_state_dict/out_proj.weight"][1] == 20
        for i in range(6):
            for slot in ("exp_avg", "exp_avg_sq", "step"):
                assert ckpt[f"optimizer_state_dict/state/{i}/{slot}"].role == "optimizer"
        assert ckpt["optimizer_state_dict/state/0/step"].shape == ()
        assert ckpt.read("optimizer_state_dict/param_groups/0/params").tolist() == [0, 1, 2, 3, 4, 5]
        for name in ("train_losses", "val_losses"):
            assert (ckpt[name].shape, ckpt[name].dtype, ckpt[name].role) == ((200,), "float64", "metadata")
        assert ckpt["best_val_loss"].role == "metadata"


def test_cnn_bn_state_dict(corpus):
    with ckptinspect.open(corpus / "zip-cnn-bn-statedict/model.pt") as ckpt:
        assert ckpt.info["zip_root"] == "model" and ckpt.info["storages"] == 25
        assert len(ckpt.variables) == 25 and all(v.role == "model" for v in ckpt.variables)
        assert [k.split(".")[0] for k in ckpt.keys()][:1] == ["hidden"]  # key order: hidden, cnn, bn
        assert shapes(ckpt)["cnn.0.weight"] == (32, 1, 5, 5)
        tracked = [v for v in ckpt.variables if v.key.endswith("num_batches_tracked")]
        assert len(tracked) == 3 and all((v.dtype, v.shape) == ("int64", ()) for v in tracked)
        assert "torch.LongStorage" in ckpt.info["pickle_globals"]


def test_legacy_udacity_dict(corpus):
    with ckptinspect.open(corpus / "legacy-udacity-mlp-dict/checkpoint.pth") as ckpt:
        assert ckpt.format == "torch-legacy"
        assert ckpt.read("input_size") == 784 and ckpt.read("output_size") == 10
        assert ckpt.read("hidden_layers").tolist() == [400, 200, 100]
        assert {v.key for v in ckpt.variables if v.role == "model"} == {
            f"state_dict/{k}" for k in ("hidden_layers.0.weight", "hidden_layers.0.bias", "hidden_layers.1.weight",
                                        "hidden_layers.1.bias", "hidden_layers.2.weight", "hidden_layers.2.bias",
                                        "output.weight", "output.bias")}
        assert shapes(ckpt)["state_dict/hidden_layers.0.weight"] == (400, 784)
        assert ckpt.info["state_dict_prefix"] == "state_dict/"


def test_legacy_torch03_state_dict_matches_the_whole_model_file(corpus):
    with ckptinspect.open(corpus / "legacy-torch03-whole-sequential/net_params.pkl") as ckpt:
        assert shapes(ckpt) == {"0.weight": (10, 1), "0.bias": (10,), "2.weight": (1, 10), "2.bias": (1,)}
        assert ckpt.info["pickle_globals"] == []  # legacy: reported by the refusal only


def test_peft_trainer_folder(corpus):
    folder = corpus / "hf-trainer-peft-lora-checkpoint"
    with ckptinspect.open(folder) as ckpt:  # the folder opens its adapter weights
        assert ckpt.path == str(folder / "adapter_model.safetensors")
        assert len(ckpt.variables) == 28 and sum(v.size for v in ckpt.variables) == 739_586
        assert ckpt.info["metadata"] == {"format": "pt"} and ckpt.info["header_bytes"] == 3840
        assert all(v.dtype == "float32" for v in ckpt.variables)
        assert any(".lora_A." in k for k in ckpt.keys()) and any("pre_classifier" in k for k in ckpt.keys())
    with ckptinspect.open(folder / "scheduler.pt") as sched:
        assert sched.info["storages"] == 0 and {v.role for v in sched.variables} == {"metadata"}
        assert sched.read("last_epoch") == 375 and sched.read("base_lrs").tolist() == [0.0002, 0.0002]


def test_tiny_gpt2(corpus):
    folder = corpus / "hf-tiny-gpt2-safetensors/model"
    with ckptinspect.open(folder) as ckpt:
        assert ckpt.format == "safetensors" and len(ckpt.variables) == 16
        assert sum(v.size for v in ckpt.variables) == 5936
        assert "lm_head.weight" not in ckpt and shapes(ckpt)["transformer.wte.weight"] == (100, 16)
        assert ckpt.keys() == sorted(ckpt.keys()) and ckpt.info["metadata"] == {"format": "pt"}
        assert ckpt.info["header_bytes"] == 1448


def test_distilbert_legacy_bin(corpus):
    with ckptinspect.open(corpus / "hf-bin-tiny-distilbert-legacy/tests/data/pytorch_model.bin") as ckpt:
        assert ckpt.format == "torch-legacy" and len(ckpt.variables) == 38
        assert shapes(ckpt)["distilbert.embeddings.word_embeddings.weight"] == (28996, 2)
        assert all(k.startswith(("distilbert.", "qa_outputs.")) for k in ckpt.keys())


def test_toplevel_tensor(corpus):
    with ckptinspect.open(corpus / "zip-toplevel-tensor/tests/data/new_pytorch_model.bin") as ckpt:
        assert [(v.key, v.shape, v.dtype, v.role) for v in ckpt.variables] == [("tensor", (3, 4), "float32", "model")]


def test_unaligned_safetensors(corpus):
    with ckptinspect.open(corpus / "safetensors-unaligned-header/models/Lora/EasyNegative.safetensors") as ckpt:
        assert shapes(ckpt) == {"emb_params": (8, 768)} and "metadata" not in ckpt.info
        assert ckpt.info["header_bytes"] == 71 and "byte 79" in ckpt.info["data_alignment"]
        value = ckpt.read("emb_params")
        assert value.flags.aligned and math.isfinite(float(value.sum()))


def test_a1111_embedding_on_cuda(corpus):
    with ckptinspect.open(corpus / "zip-a1111-textual-inversion/embeddings/bad-hands-5.pt") as ckpt:
        assert (ckpt.step, ckpt.step_source) == (1419, "variable:step")
        assert ckpt["string_to_param/*"].shape == (2, 768) and ckpt["string_to_param/*"].role == "model"
        assert ckpt.read("string_to_token/*") == 265 and ckpt["string_to_token/*"].role == "metadata"
        assert ckpt.info["storage_locations"] == {"cuda:0": 1}
        assert ckpt.info["strings"]["name"] == "bad-hands-5"


def test_tinygrad_and_user_metadata_safetensors(corpus):
    with ckptinspect.open(corpus / "safetensors-tinygrad-writer/model.safetensors") as ckpt:
        assert shapes(ckpt) == {"l1.weight": (128, 784), "l2.weight": (10, 128)} and "metadata" not in ckpt.info
    with ckptinspect.open(corpus / "safetensors-user-metadata-no-format/model.safetensors") as ckpt:
        assert ckpt.info["metadata"] == {"version": "1.0", "git_tag": "v1.45"}
        assert sum(v.size for v in ckpt.variables) == 430 and len(ckpt.variables) == 4
