"""Tessera's checkpoint files and the `safetensors` package agree byte for byte,
in both directions (files written by `tessera ckpt write-sample`, files written
by the package and read by `tessera ckpt inspect --json`)."""
import hashlib
import json
import os
import subprocess

import numpy as np
import pytest
import safetensors
from safetensors import safe_open
from safetensors.numpy import save_file

TESSERA = os.environ["TESSERA_BIN"]
DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32, "i64": np.int64}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (no NaNs here)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def expected_sample(k: int, name: str) -> bytes:
    """What `tessera ckpt write-sample` stores: value i of tensor k is ((i*7+k) % 251 - 125), /4 for floats."""
    v = (np.arange(30) * 7 + k) % 251 - 125
    if name == "bf16":
        return bf16_bits(v / 4.0).reshape(6, 5).tobytes()
    dt = DTYPES[name]
    vals = v if np.issubdtype(dt, np.integer) else v / 4.0
    return vals.astype(dt).reshape(6, 5).tobytes()


def test_package_reads_tessera_file(tmp_path):
    path = tmp_path / "tessera.safetensors"
    subprocess.run([TESSERA, "ckpt", "write-sample", str(path)], check=True)
    raw = path.read_bytes()
    tensors = dict(safetensors.deserialize(raw))
    names = ["f32", "f64", "f16", "bf16", "i32", "i64"]
    assert sorted(tensors) == sorted("layer." + n for n in names)
    for k, name in enumerate(names):
        t = tensors["layer." + name]
        assert t["dtype"].upper() in (name.upper(), {"f16": "F16", "bf16": "BF16"}.get(name, ""))
        assert list(t["shape"]) == [6, 5]
        assert bytes(t["data"]) == expected_sample(k, name), name
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"writer": "tessera", "step": "7"}
        for k, name in enumerate(names):
            if name == "bf16":
                continue  # numpy has no bfloat16; compared as bytes above
            np.testing.assert_array_equal(
                f.get_tensor("layer." + name),
                np.frombuffer(expected_sample(k, name), dtype=DTYPES[name]).reshape(6, 5))


def test_tessera_reads_package_file(tmp_path):
    rng = np.random.default_rng(3)
    arrays = {
        "encoder.w": rng.standard_normal((17, 9)).astype(np.float32),
        "encoder.b": rng.standard_normal(9),
        "half": rng.standard_normal((4, 4)).astype(np.float16),
        "ids": rng.integers(-1000, 1000, size=(3, 3, 3), dtype=np.int64),
        "count": np.array(12345, dtype=np.int32),
    }
    path = tmp_path / "package.safetensors"
    save_file(arrays, str(path), metadata={"step": "11", "writer": "safetensors"})
    bits = np.ascontiguousarray(bf16_bits(rng.standard_normal(10).astype(np.float32)))
    bf16 = bits.tobytes()
    path_bf16 = tmp_path / "bf16.safetensors"
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8 takes specs of raw buffers
        spec = {"x": safetensors.TensorSpec(dtype="bfloat16", shape=[10], data_ptr=bits.ctypes.data,
                                            data_len=bits.nbytes)}
    else:
        spec = {"x": {"dtype": "bfloat16", "shape": [10], "data": bf16}}
    safetensors.serialize_file(spec, str(path_bf16))

    out = subprocess.run([TESSERA, "ckpt", "inspect", "--json", str(path), str(path_bf16)],
                         check=True, capture_output=True, text=True).stdout
    files = json.loads(out)
    seen = {t["name"]: t for f in files for t in f["tensors"]}
    assert files[0]["metadata"] == {"step": "11", "writer": "safetensors"}
    for name, a in arrays.items():
        t = seen[name]
        assert t["shape"] == list(a.shape)
        assert t["sha256"] == hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest(), name
    assert seen["x"]["dtype"] == "BF16"
    assert seen["x"]["sha256"] == hashlib.sha256(bf16).hexdigest()
    subprocess.run([TESSERA, "ckpt", "verify", str(tmp_path)], check=True)


def test_truncated_package_file_is_refused(tmp_path):
    path = tmp_path / "cut.safetensors"
    save_file({"w": np.ones((100,), dtype=np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    r = subprocess.run([TESSERA, "ckpt", "verify", str(path)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "BROKEN" in r.stdout and "truncated" in r.stdout


def test_package_reads_a_cluster_checkpoint(tmp_path):
    """A checkpoint written by a running cluster (2 shards, the example's
    w and b, SGD) opens with the package: every tensor of the index is in the
    file it names, the bytes agree with `tessera ckpt inspect`, and w is the
    value the chief pulled after its last step."""
    example = os.environ.get("LINEAR_REGRESSION")
    if not example:
        pytest.skip("LINEAR_REGRESSION is not set (run through meson test)")
    ckpt = tmp_path / "ckpt"
    run = subprocess.run([TESSERA, "launch", "--ps", "2", "--workers", "2", "--checkpoint-dir",
                          str(ckpt), "--", example, "30"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, UCX_TLS="tcp"))
    assert run.returncode == 0, run.stdout + run.stderr
    last = [line for line in run.stdout.splitlines() if "step  29" in line]
    assert last, run.stdout
    w_printed = float(last[0].split(" w ")[1].split()[0])

    step_dir = ckpt / "step-00000030"  # the final checkpoint, taken at shutdown
    assert step_dir.is_dir(), sorted(os.listdir(ckpt))
    index = json.loads((step_dir / "model.safetensors.index.json").read_text())
    manifest = json.loads((step_dir / "tessera.json").read_text())
    assert manifest["global_step"] == 30
    assert sorted(f["name"] for f in manifest["files"]) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    total = 0
    seen = {}
    for name, file in index["weight_map"].items():
        with safe_open(str(step_dir / file), framework="numpy") as f:
            assert name in f.keys(), (name, file)
            seen[name] = f.get_tensor(name)
            total += seen[name].nbytes
    assert sorted(seen) == ["b", "w"]  # SGD keeps no state
    assert index["metadata"]["total_size"] == total
    assert seen["w"].dtype == np.float32 and seen["w"].shape == (1,)
    assert abs(float(seen["w"][0]) - w_printed) < 6e-5
    out = subprocess.run([TESSERA, "ckpt", "inspect", "--json", str(step_dir)], check=True,
                         capture_output=True, text=True).stdout
    for f in json.loads(out):
        for t in f["tensors"]:
            assert hashlib.sha256(seen[t["name"]].tobytes()).hexdigest() == t["sha256"]


def gpu_usable() -> str:
    """'' when this machine's Tessera can use a GPU, else why not (`tessera doctor`)."""
    out = subprocess.run([TESSERA, "doctor", "--json"], capture_output=True, text=True).stdout
    for finding in json.loads(out):
        if finding["check"] == "gpu-registration":
            return "" if finding["data"].get("cuda") == "ok" else finding["data"].get("cuda", "?")
    return "tessera doctor has no gpu-registration check"


def train_and_checkpoint(tmp_path, memory: str):
    """Trains the linear-regression example with parameters in `memory`; returns the
    checkpoint's tensors as read by the safetensors package."""
    ckpt = tmp_path / memory
    subprocess.run([TESSERA, "launch", "--ps", "1", "--workers", "1", "--memory", memory,
                    "--allow-host-staging", "--checkpoint-dir", str(ckpt), "--",
                    os.environ["LINEAR_REGRESSION"], "60"], check=True, timeout=120)
    steps = sorted(p for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert steps, f"no checkpoint in {ckpt}"
    files = sorted(steps[-1].glob("*.safetensors"))
    tensors = {}
    for f in files:
        tensors.update(dict(safetensors.deserialize(f.read_bytes())))
    return steps[-1].name, tensors


@pytest.mark.parametrize("memory", ["host", "cuda"])
def test_package_reads_a_checkpoint_of_parameters_in(tmp_path, memory):
    """A checkpoint of GPU-resident parameters is an ordinary safetensors file,
    with the same bytes as the same training on host memory."""
    if memory == "cuda" and (why := gpu_usable()):
        pytest.skip(f"needs a GPU: {why}")
    step, tensors = train_and_checkpoint(tmp_path, memory)
    assert "w" in tensors and "b" in tensors, sorted(tensors)
    w = np.frombuffer(bytes(tensors["w"]["data"]), dtype=np.float32)
    assert abs(float(w.reshape(-1)[0]) - 2.0) < 0.5, w
    if memory == "cuda":
        host_step, host = train_and_checkpoint(tmp_path, "host")
        assert host_step == step
        for name, t in host.items():
            assert bytes(tensors[name]["data"]) == bytes(t["data"]), name
