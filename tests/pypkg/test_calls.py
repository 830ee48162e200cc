"""What tessera.Client offers beside push and pull: read-only clients,
control calls as futures (in order, with results), cancel(), and calls
ordered on a CUDA stream (which without a GPU say why they cannot be)."""

import asyncio

import numpy as np
import pytest
import torch

import tessera


def test_reader_pulls_and_cannot_write(client, name):
    t = client.declare(name, (4,), "f32", "add", initializer=tessera.constant(2.0))
    client.initialize()
    with tessera.Client.from_env(argv=[], read_only=True, task=("evaluator", 0)) as reader:
        assert reader.read_only and not reader.is_chief and not client.read_only
        # A reader looks the tensor up: dtype and shape, not the rule.
        r = reader.declare(name, (4,), "f32")
        out = np.zeros(4, np.float32)
        reader.pull(r, out)
        assert np.all(out == 2.0)
        for write in (lambda: reader.push(r, np.ones(4, np.float32)),
                      lambda: reader.push_pull(r, np.ones(4, np.float32), out),
                      reader.initialize,
                      lambda: reader.set_hyperparams(r, learning_rate=0.1)):
            with pytest.raises(tessera.Error) as e:
                write()
            assert e.value.code == "FailedPrecondition" and "read-only" in str(e.value)
        with pytest.raises(tessera.Error) as e:
            reader.declare(name + "-undeclared", (4,))
        assert e.value.code == "NotFound" and "-undeclared" in str(e.value)
    client.pull(t, out)
    assert np.all(out == 2.0)


def test_control_calls_as_futures_in_order(client, name):
    declared = client.declare_async(name, (3,), "f32", "add", initializer=tessera.constant(1.5))
    initialized = client.initialize_async()  # after the declare: it initialises it
    (t,) = declared.result()
    assert t.name == name and client.find(name) == t
    assert initialized.result() is None
    out = np.zeros(3, np.float32)
    client.pull(t, out)
    assert np.all(out == 1.5)
    client.wait_for_init_async(5.0).wait()

    async def declare_two():
        return await client.declare_many_async([tessera.spec(name + "a", (2,)),
                                                tessera.spec(name + "b", (5,), "f64")])
    a, b = asyncio.run(declare_two())
    assert (a.name, b.name) == (name + "a", name + "b")
    bad = client.declare_async(name, (4,), "f32", "add")  # another shape: refused
    with pytest.raises(tessera.Error) as e:
        bad.result()
    assert e.value.code == "AlreadyExists"


def test_cancel_of_a_call_that_started_or_finished(client, name):
    t = client.declare(name, (8,), "f32", "add")
    client.initialize()
    f = client.push_async(t, np.ones(8, np.float32))
    f.wait()
    assert f.cancel() is False  # done: nothing to cancel
    out = np.zeros(8, np.float32)
    client.pull(t, out, min_version=2)
    assert np.all(out == 1.0)


def test_stream_argument(client, name):
    t = client.declare(name, (2,), "f32", "add")
    client.initialize()
    grad = np.ones(2, np.float32)
    for bad in (0, object(), "stream"):
        with pytest.raises(tessera.Error) as e:
            client.push_async(t, grad, stream=bad)
        assert e.value.code == "InvalidArgument" and "stream" in str(e.value)
    if torch.cuda.is_available():
        pytest.skip("a GPU is usable here: the stream itself is tested by gpu-shard")

    class FakeStream:  # never reached: there is no CUDA to hand it to
        cuda_stream = 0x1234

    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 0x1234)

    for stream in (FakeStream(), CudaStreamProtocol(), 0x1234):
        f = client.push_async(t, grad, stream=stream)
        with pytest.raises(tessera.Error) as e:
            f.wait()
        assert "CUDA" in str(e.value) or "GPU" in str(e.value), str(e.value)
    out = np.zeros(2, np.float32)
    client.pull(t, out)
    assert np.all(out == 0.0), "a push that could not be ordered was applied"
