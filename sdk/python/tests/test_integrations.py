"""The PyTorch and Hugging Face helpers against stand-ins that implement the
part of those libraries' interfaces the helpers use (the libraries
themselves are gigabytes of CUDA wheels; the stand-ins keep these tests in
CI). What is checked is ours: what is saved, restored and reported."""

import importlib
import os
import pickle
import random
import signal
import sys
import time
import types

import pytest

import ebb_sdk


def fake_torch():
    torch = types.ModuleType("torch")
    rng = random.Random(1234)
    torch.save = lambda obj, f: pickle.dump(obj, f)
    torch.load = lambda f, map_location=None, weights_only=None: pickle.load(f)
    torch.get_rng_state = lambda: rng.getstate()
    torch.set_rng_state = lambda state: rng.setstate(state)
    torch.rand = lambda: rng.random()
    torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    return torch


class Model:
    def __init__(self):
        self.w = [0.0, 0.0]

    def state_dict(self):
        return {"w": list(self.w)}

    def load_state_dict(self, state):
        self.w = list(state["w"])


class Optimizer:
    def __init__(self):
        self.momentum = 0.0

    def state_dict(self):
        return {"momentum": self.momentum}

    def load_state_dict(self, state):
        self.momentum = state["momentum"]


def train(torch, model, opt, steps):
    """A step draws from every RNG the helper must restore."""
    for _ in range(steps):
        noise = torch.rand() + random.random()
        opt.momentum = 0.9 * opt.momentum + noise
        model.w = [w + opt.momentum for w in model.w]


@pytest.fixture
def pytorch(monkeypatch):
    torch = fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delitem(sys.modules, "ebb_sdk.pytorch", raising=False)
    module = importlib.import_module("ebb_sdk.pytorch")
    return torch, module


def test_pytorch_save_and_restore_continue_exactly(ebb_env, pytorch, endpoint):
    torch, helper = pytorch
    ckpt = ebb_sdk.CheckpointManager()
    model, opt = Model(), Optimizer()
    assert helper.restore(ckpt, model, opt) == 0, "first start: nothing to resume"
    random.seed(7)
    train(torch, model, opt, 5)
    helper.save(ckpt, 5, model, opt, extra={"epoch": 1})
    train(torch, model, opt, 5)
    uninterrupted = (model.w, opt.momentum)

    # The next attempt: fresh objects, RNGs elsewhere.
    random.seed(999)
    torch.set_rng_state(random.Random(5).getstate())
    model2, opt2 = Model(), Optimizer()
    assert helper.restore(ckpt, model2, opt2) == 5
    assert ckpt.extra == {"epoch": 1}
    train(torch, model2, opt2, 5)
    assert (model2.w, opt2.momentum) == uninterrupted
    assert [r["step"] for r in endpoint.reports] == [5]
    assert endpoint.resumes == [{"step": 5}], "the restore is reported, the first start is not"


def test_pytorch_ranks_of_a_gang_save_and_restore_their_own_parts(ebb_env, pytorch, endpoint):
    torch, helper = pytorch
    d = ebb_env["EBB_CHECKPOINT_DIR"]
    ranks = [ebb_sdk.CheckpointManager(d, rank=r, world_size=2) for r in (0, 1)]
    models = [Model(), Model()]
    for r, (ckpt, model) in enumerate(zip(ranks, models)):
        model.w = [float(r), float(r)]
        helper.save(ckpt, 3, model)
    assert [r["step"] for r in endpoint.reports] == [3], "the gang's step reported once"
    for r, ckpt in enumerate(ranks):
        model = Model()
        assert helper.restore(ckpt, model) == 3
        assert model.w == [float(r), float(r)], "each rank restores its own part"
    assert endpoint.resumes == [{"step": 3}], "the gang's resume reported once, by rank 0"


class TrainerCallback:
    """The base class `transformers` provides: every hook returns None."""

    def on_train_begin(self, args, state, control, **kwargs):
        return None

    def on_step_end(self, args, state, control, **kwargs):
        return None

    def on_save(self, args, state, control, **kwargs):
        return None


def fake_transformers():
    module = types.ModuleType("transformers")
    module.TrainerCallback = TrainerCallback
    return module


class Control:
    def __init__(self):
        self.should_save = False
        self.should_training_stop = False


def run_trainer(callback, output_dir, steps, start=0, **state):
    """The part of `Trainer`'s loop that drives callbacks: `on_train_begin`
    with the state loaded (`start`: the step resumed from); after each
    step, `on_step_end`; if asked, save `checkpoint-N` (trainer_state.json
    last) and call `on_save`; stop when asked."""
    args = types.SimpleNamespace(output_dir=output_dir)
    state = types.SimpleNamespace(global_step=start, **state)
    callback.on_train_begin(args, state, Control())
    saved = []
    for _ in range(steps):
        state.global_step += 1
        control = Control()
        control = callback.on_step_end(args, state, control) or control
        if control.should_save:
            path = os.path.join(output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(path)
            with open(os.path.join(path, "model.bin"), "wb") as f:
                f.write(b"w" * 100)
            with open(os.path.join(path, "trainer_state.json"), "w") as f:
                f.write("{}")
            callback.on_save(args, state, control)
            saved.append(state.global_step)
        if control.should_training_stop:
            break
    return state.global_step, saved


@pytest.fixture
def huggingface(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", fake_transformers())
    monkeypatch.delitem(sys.modules, "ebb_sdk.huggingface", raising=False)
    return importlib.import_module("ebb_sdk.huggingface")


def test_huggingface_callback_saves_and_stops_on_drain(ebb_env, huggingface, endpoint, tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out)
    callback = huggingface.EbbCallback()
    assert callback.interval == 600.0
    assert huggingface.last_checkpoint(out) is None
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while not ebb_sdk.drain_requested() and time.monotonic() < deadline:
        time.sleep(0.01)
    step, saved = run_trainer(callback, out, steps=100)
    assert (step, saved) == (1, [1]), "saved and stopped right after the step in flight"
    assert endpoint.reports[0]["step"] == 1 and endpoint.reports[0]["bytes"] == 102
    assert huggingface.last_checkpoint(out) == os.path.join(out, "checkpoint-1")


def test_huggingface_callback_reports_the_resume_from_the_main_process(
    ebb_env, huggingface, endpoint, tmp_path, caplog
):
    out = str(tmp_path / "out")
    os.makedirs(out)
    caplog.set_level("INFO", logger="ebb_sdk")
    run_trainer(huggingface.EbbCallback(), out, steps=1)
    assert endpoint.resumes == [], "a first start resumes nothing"
    assert "ebb: job 7 attempt 2 began from the start" in caplog.text
    caplog.clear()
    run_trainer(huggingface.EbbCallback(), out, steps=1, start=40, is_world_process_zero=False)
    assert endpoint.resumes == [], "not the main process"
    assert caplog.text == "", "noted by the main process alone"
    run_trainer(huggingface.EbbCallback(), out, steps=1, start=40, is_world_process_zero=True)
    assert endpoint.resumes == [{"step": 40}]
    assert "ebb: job 7 attempt 2 began from step 40" in caplog.text


def test_huggingface_callback_saves_on_the_interval(ebb_env, huggingface, tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out)
    callback = huggingface.EbbCallback(interval=0.0)
    step, saved = run_trainer(callback, out, steps=3)
    assert saved == [1, 2, 3]
    # A directory cut short (no trainer_state.json) is not a checkpoint.
    os.makedirs(os.path.join(out, "checkpoint-9"))
    assert huggingface.last_checkpoint(out) == os.path.join(out, "checkpoint-3")


def test_huggingface_callback_in_a_gang_reports_from_the_main_process_only(
    ebb_env, huggingface, endpoint, tmp_path, monkeypatch
):
    def run(name, steps, **state):
        os.makedirs(tmp_path / name)
        return run_trainer(huggingface.EbbCallback(interval=0.0), str(tmp_path / name), steps, **state)

    run("rank1", steps=2, is_world_process_zero=False)
    assert endpoint.reports == [], "not the main process"
    # Without `Trainer`'s word on it, the rank from the environment decides.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    run("rank1-env", steps=1)
    assert endpoint.reports == []
    _, saved = run("rank0", steps=3, is_world_process_zero=True)
    assert [r["step"] for r in endpoint.reports] == saved == [1, 2, 3]


def test_the_core_package_imports_neither_library():
    import subprocess

    code = "import sys, ebb_sdk; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_start_mlflow_run_keeps_one_run_across_attempts(ebb_env, monkeypatch, tmp_path):
    """The real MLflow client (mlflow-skinny) on a local store: three
    attempts of job 7, each starting its run the same way, log to one
    run; another job's attempt gets a run of its own."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    from ebb_sdk.tracking import TAG, start_mlflow_run

    mlflow.set_tracking_uri(f"file://{tmp_path / 'mlruns'}")
    experiment = mlflow.set_experiment("ebb").experiment_id
    monkeypatch.setenv("EBB_RUN_ID", "ebb-7-abc")
    ids = []
    for attempt in (1, 2, 3):
        monkeypatch.setenv("EBB_ATTEMPT", str(attempt))
        with start_mlflow_run() as run:
            mlflow.log_metric("attempt", attempt, step=attempt)
            ids.append(run.info.run_id)
    assert len(set(ids)) == 1, ids
    runs = mlflow.search_runs(experiment_ids=[experiment], output_format="list")
    assert len(runs) == 1
    assert runs[0].data.tags[TAG] == "ebb-7-abc" and runs[0].info.run_name == "ebb-7-abc"
    history = mlflow.MlflowClient().get_metric_history(ids[0], "attempt")
    assert [m.value for m in history] == [1, 2, 3]
    monkeypatch.setenv("EBB_RUN_ID", "ebb-8-abd")
    with start_mlflow_run() as other:
        assert other.info.run_id != ids[0]
    seen = {ids[0], other.info.run_id}
    for bad in (None, "ebb-7-abc' OR '1'='1"):
        if bad is None:
            monkeypatch.delenv("EBB_RUN_ID")
        else:
            monkeypatch.setenv("EBB_RUN_ID", bad)
        with start_mlflow_run() as plain:
            assert plain.info.run_id not in seen, f"{bad!r} is no run id of Ebb's: a new run"
            seen.add(plain.info.run_id)
