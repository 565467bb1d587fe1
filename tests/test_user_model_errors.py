"""A failure of the user's model is the user's error: one line naming the factory, the stage and the message, exit 2.

Every case is refused before anything is written (the model is probed on two public examples in
``dpaudit.campaign.plan.check_inputs``), so none leaves a run directory and none trains. A bug of dpaudit's own,
planted where the probe runs the user's forward pass, is still an internal error (exit 3, traceback).
"""

import sys

import pytest

from dpaudit.cli import main
from tests.one_line import one_line_error
from tests.small_data import write_npz

_MODELS = """
import sys

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, input_shape, num_classes, outputs=None):
        super().__init__()
        self.hidden = nn.Linear(input_shape[0], 6)
        self.head = nn.Linear(6, num_classes if outputs is None else outputs)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x)))


class Wrapped(Net):
    def __init__(self, input_shape, num_classes, shape_logits):
        super().__init__(input_shape, num_classes)
        self.shape_logits = shape_logits

    def forward(self, x):
        return self.shape_logits(super().forward(x))


class ItemInForward(Net):
    def forward(self, x):
        logits = super().forward(x)
        return logits * 2 if logits.sum().item() > 0 else logits


class NumpyInForward(Net):
    def forward(self, x):
        return super().forward(torch.from_numpy(x.numpy()))


class FailsOnLargerBatches(Net):
    def forward(self, x):
        if len(x) > 2:  # passes the probe's two examples
            raise RuntimeError("only two rows at a time")
        return super().forward(x)


class FailsInShadowTraining(Net):
    def forward(self, x):
        # the engine's K > 1 shadow models: batched parameters of more than one model (the reference model that
        # labels the canary trains alone)
        weight = self.head.weight
        if torch._C._functorch.is_batchedtensor(weight):
            models = torch._C._functorch.get_unwrapped(weight).shape[torch._C._functorch.maybe_get_bdim(weight)]
            if models > 1:
                raise RuntimeError("not with batched parameters")
        return super().forward(x)


class FailsInTrainingMode(Net):
    def forward(self, x):
        if self.training:
            raise RuntimeError("this model only evaluates")
        return super().forward(x)


def good(input_shape, num_classes):
    return Net(input_shape, num_classes)


def raises(input_shape, num_classes):
    raise RuntimeError("the factory's own failure")


def exits_cleanly(input_shape, num_classes):
    sys.exit(0)


def exits_with_a_message(input_shape, num_classes):
    sys.exit("no model today")


def a_dict_without_logits(input_shape, num_classes):
    return Wrapped(input_shape, num_classes, lambda logits: {"scores": logits})


def a_scalar(input_shape, num_classes):
    return Wrapped(input_shape, num_classes, lambda logits: logits.sum())


def an_extra_dimension(input_shape, num_classes):
    return Wrapped(input_shape, num_classes, lambda logits: logits.unsqueeze(-1))


def one_output(input_shape, num_classes):
    return Net(input_shape, num_classes, outputs=1)


def one_output_too_many(input_shape, num_classes):
    return Net(input_shape, num_classes, outputs=num_classes + 1)


def fails_on_larger_batches(input_shape, num_classes):
    return FailsOnLargerBatches(input_shape, num_classes)


def fails_in_shadow_training(input_shape, num_classes):
    return FailsInShadowTraining(input_shape, num_classes)


def float64(input_shape, num_classes):
    return Net(input_shape, num_classes).double()


def float16(input_shape, num_classes):
    return Net(input_shape, num_classes).half()


def bfloat16(input_shape, num_classes):
    return Net(input_shape, num_classes).bfloat16()


def frozen(input_shape, num_classes):
    return Net(input_shape, num_classes).requires_grad_(False)


def item_in_forward(input_shape, num_classes):
    return ItemInForward(input_shape, num_classes)


def numpy_in_forward(input_shape, num_classes):
    return NumpyInForward(input_shape, num_classes)


def fails_in_training_mode(input_shape, num_classes):
    return FailsInTrainingMode(input_shape, num_classes)


def lazy(input_shape, num_classes):
    return nn.Sequential(nn.LazyLinear(6), nn.ReLU(), nn.Linear(6, num_classes))


def conv_on_vectors(input_shape, num_classes):
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4, num_classes))


def bad_task(input_shape, num_classes):
    model = Net(input_shape, num_classes)
    model.task = "regression"
    return model
"""


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """user_models.py, a module with a syntax error and one whose import fails on the path; a small npz's spec."""
    root = tmp_path_factory.mktemp("user-code")
    (root / "user_models.py").write_text(_MODELS)
    (root / "user_syntax_error.py").write_text("def factory(input_shape, num_classes:\n    pass\n")
    (root / "user_import_error.py").write_text("import no_such_dependency_xyz\n")
    dataset = write_npz(root, 8)
    sys.path.insert(0, str(root))
    yield dataset
    sys.path.remove(str(root))
    for name in ("user_models", "user_syntax_error", "user_import_error"):
        sys.modules.pop(name, None)


_TINY = ["--models", "4", "--epochs", "1", "--rank", "4", "--quiet"]


def _audit(dataset, out, *options: str) -> int:
    return main(["audit", "--dataset", dataset, *options, *_TINY, "--out", str(out)])


@pytest.mark.parametrize(
    ("factory", "fragments"),
    [
        ("user_models:raises", ["building the model, raises((8,), 2)", "RuntimeError: the factory's own failure"]),
        ("user_models:exits_cleanly", ["building the model", "SystemExit: sys.exit(0)"]),
        ("user_models:exits_with_a_message", ["SystemExit: sys.exit('no model today')"]),
        ("user_syntax_error:factory", ["importing module 'user_syntax_error'", "SyntaxError"]),
        ("user_import_error:factory", ["importing module 'user_import_error'", "'no_such_dependency_xyz'"]),
        (
            "user_models:a_dict_without_logits",
            ["returned a dict on a batch of shape (2, 8)", "(batch, classes), here (2, 2)", "dict with `logits`"],
        ),
        ("user_models:a_scalar", ["returned shape ()"]),
        ("user_models:an_extra_dimension", ["returned shape (2, 2, 1)"]),
        ("user_models:one_output", ["returned shape (2, 1)", "one output per class of the data (2)"]),
        ("user_models:one_output_too_many", ["returned shape (2, 3)", "one output per class of the data (2)"]),
        ("user_models:float64", ["parameter 'hidden.weight' is torch.float64", "model.float()"]),
        ("user_models:float16", ["is torch.float16", "model.float()"]),
        ("user_models:bfloat16", ["is torch.bfloat16", "model.float()"]),
        ("user_models:frozen", ["every parameter of the model is frozen", "--no-pretrain"]),
        ("user_models:item_in_forward", ["the training step's gradients on a batch of shape (2, 8)", ".item()"]),
        ("user_models:numpy_in_forward", ["the training step's gradients on a batch of shape (2, 8)"]),
        ("user_models:fails_in_training_mode", ["a pretraining step (training mode)", "this model only evaluates"]),
        ("user_models:lazy", ["parameter '0.weight' has no shape yet", "nn.Linear(d_in, d_out)"]),
        ("user_models:conv_on_vectors", ["its forward pass on a batch of shape (2, 8)", "RuntimeError"]),
        ("torch.nn:Linear", ["--model torch.nn:Linear: building the model, Linear((8,), 2)", "TypeError"]),
        ("user_models:bad_task", ["`task` attribute is 'regression'", "classification"]),
    ],
)
def test_a_failing_user_model_is_one_line_naming_the_stage(user_files, tmp_path, capsys, factory, fragments):
    out = tmp_path / "run"
    assert _audit(user_files, out, "--model", factory) == 2
    err = one_line_error(capsys, f"--model {factory}", *fragments)
    assert "internal error" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("factory", "options", "stage"),
    [
        ("user_models:fails_on_larger_batches", [], "pretraining on the public split"),
        # where workers train a chunk, the same one line travels back (shadow.train_chunk raises it there)
        ("user_models:fails_in_shadow_training", ["--workers", "1"], "training shadow models 0-3"),
    ],
)
def test_a_user_model_failing_after_the_probe_is_still_one_line_naming_it(
    user_files, tmp_path, capsys, factory, options, stage
):
    """Past the probe the run directory exists (its lock is taken); no model in it has finished.

    By then dpaudit has said on stderr which layers LoRA adapts: the error is the one line after it.
    """
    out = tmp_path / "run"
    assert _audit(user_files, out, "--model", factory, *options) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    said, error = err.strip().splitlines()
    assert said.startswith("dpaudit: LoRA adapts") and error.startswith(
        f"dpaudit: error: --model {factory}: {stage} failed, in your code: RuntimeError"
    ), err
    assert not list((out / "chunks").glob("*"))


def test_a_planted_dpaudit_bug_around_the_users_forward_pass_is_still_an_internal_error(
    user_files, tmp_path, capsys, monkeypatch
):
    """The probe runs dpaudit's loss on the user's logits: a failure there is dpaudit's, exit 3."""
    from dpaudit import models

    def planted(*args, **kwargs):
        raise ValueError("planted bug")

    monkeypatch.setattr(models, "example_losses", planted)
    monkeypatch.delenv("DPAUDIT_DEBUG", raising=False)
    out = tmp_path / "run"
    assert _audit(user_files, out, "--model", "user_models:good") == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: planted bug" in err and "internal error" in err
    assert not out.exists()


def test_sys_exit_anywhere_in_a_command_is_an_error_never_exit_0(monkeypatch, capsys):
    """Code a command runs outside the probed stages (a trainer, a statistic) calling sys.exit(0) is still exit 2."""
    from accountants import gaussian

    monkeypatch.setattr(gaussian, "epsilon", lambda *args, **kwargs: sys.exit(0))
    monkeypatch.delenv("DPAUDIT_DEBUG", raising=False)
    assert main(["bounds", "gaussian", "--sigma", "1", "--delta", "1e-5"]) == 2
    one_line_error(capsys, "called sys.exit(0)")
