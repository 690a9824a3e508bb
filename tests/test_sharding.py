"""Sharding: every parameter names its logical axes, the rules place them on a mesh, and the mesh
settings fail clearly. (The layouts' losses and restores are in ``test_train.py``.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from conftest import REPO, VARIANTS, covering_layers, run_lmzoo, tiny_config
from lmzoo.model import LM
from lmzoo.record.directory import RunDir
from lmzoo.schema import ConfigError
from lmzoo.sharding import LOGICAL_AXES, MeshConfig, logical_names, partition_spec


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_parameter_names_its_logical_axes(variant):
    """Every kind of layer the variant has built (a hybrid's too), shapes only."""
    cfg = tiny_config(variant, f"model.n_layers={covering_layers(variant)}")
    model = nnx.eval_shape(lambda: LM(cfg, 259, rngs=nnx.Rngs(0)))
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = logical_names(variable)
        where = "/".join(map(str, path))
        assert names is not None, f"{variant}: parameter {where} has no logical axis names"
        assert len(names) == variable.get_value().ndim, f"{variant}: {where} names {names} for shape {variable.shape}"
        assert set(names) <= set(LOGICAL_AXES) | {None}, f"{variant}: {where} has unknown names {names}"


class FakeMesh:
    shape = {"data": 2, "fsdp": 2, "tensor": 2}


RULES = MeshConfig().rules


@pytest.mark.parametrize("shape, names, expected", [
    ((128, 384), ("embed", "inner"), P("fsdp", "tensor")),
    ((384, 128), ("inner", "embed"), P("tensor", "fsdp")),
    ((3, 128), (None, "inner"), P(None, "tensor")),
    ((4, 7), ("embed", "inner"), P("fsdp", None)),  # 7 columns do not split over 2 devices: whole
    ((8, 8), ("inner", "mlp"), P("tensor", None)),  # tensor splits one dimension of an array only
])
def test_logical_names_map_to_mesh_axes(shape, names, expected):
    assert partition_spec(shape, names, RULES, FakeMesh) == expected


@pytest.mark.parametrize("mesh, devices, message", [
    (MeshConfig(data=-1, fsdp=-1), 8, "only one axis"),
    (MeshConfig(data=3), 8, "data x fsdp x tensor = 3"),
    (MeshConfig(data=-1, tensor=3), 8, "groups of 3"),
    (MeshConfig(fsdp=0), 8, "train.mesh.fsdp=0"),
])
def test_bad_mesh_sizes_fail_in_one_line(mesh, devices, message):
    with pytest.raises(ConfigError, match=message):
        mesh.sizes(devices)


def test_bad_rules_fail_in_one_line():
    with pytest.raises(ConfigError, match="train.mesh.rules.embed='model'"):
        MeshConfig(rules={"embed": "model"}).check()
    with pytest.raises(ConfigError, match="not a logical axis"):
        MeshConfig(rules={"width": "tensor"}).check()


def test_the_rest_of_the_devices_go_to_the_free_axis():
    assert MeshConfig().sizes(8) == (8, 1, 1)
    assert MeshConfig(data=1, fsdp=-1, tensor=2).sizes(8) == (1, 4, 2)


# ----------------------------------------------------------------------------- layouts on 8 simulated devices

LAYOUTS = {  # train.mesh overrides: data, fsdp, tensor and all three at once
    "data": ["train.mesh.data=-1"],
    "fsdp": ["train.mesh.data=1", "train.mesh.fsdp=-1"],
    "tensor": ["train.mesh.data=1", "train.mesh.tensor=-1"],
    "mixed": ["train.mesh.data=2", "train.mesh.fsdp=2", "train.mesh.tensor=-1"],
}
LAYOUT_VARIANTS = ("softmax", "gla", "mamba", "gla_softmax")
# softmax along each axis alone; every variant with all three axes at once (the layout that splits most)
LAYOUT_RUNS = [("softmax", layout) for layout in ("data", "fsdp", "tensor")] + [(v, "mixed") for v in LAYOUT_VARIANTS]

LAYOUT_SNIPPET = """
import json, shutil, sys
import jax
from conftest import fewest_layers, tiny_config
from lmzoo.record.directory import RunDir
from lmzoo.run.loop import Trainer, train

layouts, variants, out = json.loads(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
result = {"devices": jax.device_count(), "losses": {}, "split": {}}

def config(variant, layout, run, *extra):  # each kind of layer once: the rules place each layer of a kind alike
    return tiny_config(variant, *fewest_layers(variant, 1), "train.steps=3", "train.log_every=1", "train.probe_batch=0",
                       *layouts[layout], *extra, run_dir=f"{out}/{run}")

def losses(run):
    return [r["loss"] for r in RunDir(f"{out}/{run}").read_metrics() if "loss" in r]

runs = json.loads(sys.argv[4]) or [(variant, layout) for variant in variants for layout in layouts]
for variant, layout in runs:
    train(config(variant, layout, f"{variant}-{layout}"))
    result["losses"][f"{variant}/{layout}"] = losses(f"{variant}-{layout}")
for layout in layouts:  # how the first mixer's input projection and its optimizer moment are split
    trainer = Trainer(config("softmax", layout, f"softmax-{layout}"))
    kernel = trainer.state["params"]["blocks"][0]["mixer"]["q_proj"]["kernel"].get_value()
    moment = trainer.state["opt"][1][0].mu["blocks"][0]["mixer"]["q_proj"]["kernel"].get_value()
    result["split"][layout] = [str(kernel.sharding.spec), kernel.sharding.shard_shape(kernel.shape),
                               moment.sharding.shard_shape(moment.shape)]
    trainer.close()
if "mixed" in layouts:  # written under one layout, resumed under another: step 3 again, from step 2's checkpoint
    train(config("softmax", "data", "moved", "train.checkpoint_every=2"))
    shutil.rmtree(f"{out}/moved/checkpoints/3")
    train(config("softmax", "mixed", "moved", "train.checkpoint_every=2"))
    result["losses"]["moved"] = losses("moved")
print(json.dumps(result))
"""


def run_layouts(tmp_path, devices: int, layouts: dict, runs=()) -> dict:
    """Train each (variant, layout) of ``runs`` (default: every variant under every layout) on ``devices``."""
    env = {"XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": str(REPO / "tests")}
    proc = run_lmzoo("-c", LAYOUT_SNIPPET, json.dumps(layouts), ",".join(LAYOUT_VARIANTS), str(tmp_path / str(devices)),
                     json.dumps(list(runs)), env=env, check=True, timeout=900)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_layouts_on_eight_devices_give_the_one_device_losses(tmp_path):
    """Softmax along each axis alone, every variant with all three at once (2 x 2 x 2); the parameters
    and their optimizer moments really split; a checkpoint moves between layouts."""
    one = run_layouts(tmp_path, 1, {"data": LAYOUTS["data"]})
    eight = run_layouts(tmp_path, 8, LAYOUTS, LAYOUT_RUNS)
    assert (one["devices"], eight["devices"]) == (1, 8)
    assert len(eight["losses"]) == len(LAYOUT_RUNS) + 1  # every run, and "moved"
    for run, losses in eight["losses"].items():
        variant = "softmax" if run == "moved" else run.split("/")[0]
        np.testing.assert_allclose(losses, one["losses"][f"{variant}/data"], rtol=1e-5, err_msg=run)
    np.testing.assert_allclose(eight["losses"]["moved"], one["losses"]["softmax/data"], rtol=1e-5)
    # q_proj [32, 32]: (embed, inner) -> whole, (fsdp), (tensor), (fsdp, tensor); its Adam moment alike
    assert eight["split"]["data"][1:] == [[32, 32], [32, 32]]
    assert eight["split"]["fsdp"][1:] == [[4, 32], [4, 32]]
    assert eight["split"]["tensor"][1:] == [[32, 4], [32, 4]]
    assert eight["split"]["mixed"][1:] == [[16, 16], [16, 16]]


# ----------------------------------------------------------------------------- several processes on one machine

PROCESS_SNIPPET = """
import os, sys
from conftest import tiny_config
from lmzoo.run import loop as training

run_dir, port, processes, index, killed_at, layout = sys.argv[1:7]
overrides = ["model.n_layers=1", "train.steps=4", "train.log_every=1", "train.eval_every=4", "train.checkpoint_every=2",
             "train.probe_batch=0", *layout.split()]
if int(processes) > 1:
    overrides += ["train.distributed=true", f"train.coordinator_address=127.0.0.1:{port}",
                  f"train.num_processes={processes}", f"train.process_id={index}"]
if killed_at != "never":
    save = training.Trainer.save

    def save_then_die(self):  # killed right after the checkpoint: nothing after it reaches the disk
        save(self)
        if self.step == int(killed_at):
            os._exit(137)

    training.Trainer.save = save_then_die
training.train(tiny_config("softmax", *overrides, run_dir=run_dir))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(run_dir, processes: int, devices_each: int, killed_at="never", layout="") -> list[int]:
    """``processes`` trainers of one run, each with its own CPU devices; their exit codes."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO / "tests"),
           "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={devices_each}"}
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS_SNIPPET, str(run_dir), str(port), str(processes), str(i),
                               str(killed_at), layout], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(processes)]
    codes = []
    # A process still finishing the checkpoint when its peer has died is aborted by JAX's coordination service
    # (SIGABRT, -6) rather than dying as told: both are the kill the test means.
    killed = (137, -signal.SIGABRT) if killed_at != "never" else ()
    for proc in procs:
        output, _ = proc.communicate(timeout=600)
        codes.append(137 if proc.returncode in killed else proc.returncode)
        if proc.returncode not in (0, *killed):
            raise AssertionError(f"exit {proc.returncode}\n{output[-3000:]}")
    return codes


def step_losses(run_dir) -> list[float]:
    return [row["loss"] for row in RunDir(run_dir).read_metrics() if "loss" in row]


@pytest.mark.slow
def test_processes_of_one_run_give_the_one_process_losses(tmp_path):
    """Each process feeds its own rows. Two processes with the parameters split across them (fsdp),
    killed right after step 2's checkpoint, resume to the end; four processes run it whole; both
    give the one-process run's losses."""
    assert run_processes(tmp_path / "one", 1, 1) == [0]
    expected = step_losses(tmp_path / "one")
    fsdp = "train.mesh.data=1 train.mesh.fsdp=-1"
    two = tmp_path / "two"
    assert run_processes(two, 2, 2, killed_at=2, layout=fsdp) == [137, 137]
    assert [row["step"] for row in RunDir(two).read_metrics() if "loss" in row] == [1, 2]
    assert run_processes(two, 2, 2, layout=fsdp) == [0, 0]
    four = tmp_path / "four"
    assert run_processes(four, 4, 1) == [0] * 4
    for run_dir, devices in ((two, 4), (four, 4)):
        assert RunDir(run_dir).read_metrics()[-1]["step"] == 4
        assert json.loads((run_dir / "run_info.json").read_text())["devices"] == devices
        np.testing.assert_allclose(step_losses(run_dir), expected, rtol=1e-5, err_msg=str(run_dir))
