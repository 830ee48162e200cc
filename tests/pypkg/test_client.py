"""tessera.Client with NumPy arrays: pushes, pulls and push_pulls in place,
errors with their Status text, futures, and the GIL released while waiting."""

import asyncio
import threading
import time

import numpy as np
import pytest

import tessera

# Large enough to go one-sided (above the client's inline_bytes, 8 KiB), and
# over the chunk size so that it spreads over both ps tasks.
BIG = (5 << 20) // 4


def declare_ready(client, name, n, rule="add", initial=1.0, **kwargs):
    t = client.declare(name, (n,), "f32", rule, initializer=tessera.constant(initial), **kwargs)
    client.initialize()
    return t


def test_pull_writes_the_callers_array_one_sided(client, name):
    t = declare_ready(client, name, BIG)
    out = np.zeros(BIG, np.float32)
    address = out.ctypes.data
    before = client.counters()
    client.pull(t, out)
    after = client.counters()
    assert out.ctypes.data == address
    assert np.all(out == 1.0)
    # The bytes came by one-sided gets into `out` itself, not in messages.
    assert after.get_bytes - before.get_bytes == out.nbytes
    assert after.message_bytes_received - before.message_bytes_received < out.nbytes // 100


def test_push_reads_the_callers_array_one_sided(client, name):
    t = declare_ready(client, name, BIG)
    grad = np.full(BIG, 2.0, np.float32)
    before = client.counters()
    client.push(t, grad)
    after = client.counters()
    assert after.put_bytes - before.put_bytes == grad.nbytes
    assert after.message_bytes_sent - before.message_bytes_sent < grad.nbytes // 100
    out = np.empty_like(grad)
    client.pull(t, out, min_version=2)
    assert np.all(out == 3.0)


def test_push_pull_returns_the_value_with_the_push_applied(client, name):
    t = declare_ready(client, name, 1000, rule="sgd", learning_rate=0.5)
    grad = np.ones(1000, np.float32)
    weights = np.zeros(1000, np.float32)
    client.push_pull(t, grad, weights)
    assert np.allclose(weights, 0.5)


def test_small_and_multidimensional_arrays(client, name):
    t = client.declare(name, (3, 4), "f64", "assign")
    client.initialize()
    value = np.arange(12, dtype=np.float64).reshape(3, 4)
    client.push(t, value)
    out = np.zeros((3, 4), np.float64)
    client.pull(t, out, min_version=2)
    assert np.array_equal(out, value)
    info = client.info(t)
    assert info.name == name and info.shape == [3, 4] and info.dtype == tessera.DType.F64
    assert client.find(name) == t and hash(client.find(name)) == hash(t)


def test_many_tensors_in_one_call(client, name):
    a = client.declare(name + "a", (10,), "f32", "add")
    b = client.declare(name + "b", (20,), "i64", "add")
    client.initialize()
    client.push({a: np.ones(10, np.float32), b: np.full(20, 7, np.int64)})
    out_a, out_b = np.zeros(10, np.float32), np.zeros(20, np.int64)
    client.pull({a: out_a, b: out_b}, min_version=2)
    assert np.all(out_a == 1) and np.all(out_b == 7)


def test_errors_carry_the_status_text(client, name):
    t = declare_ready(client, name, 16)
    with pytest.raises(tessera.Error, match="f64") as e:
        client.push(t, np.zeros(16, np.float64))
    assert e.value.code == "InvalidArgument"
    with pytest.raises(tessera.Error, match=r"shape \(15,\), but the tensor's shape is \[16\]"):
        client.pull(t, np.zeros(15, np.float32))
    frozen = np.zeros(16, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(tessera.Error, match=f"tensor '{name}': the array is read-only"):
        client.pull(t, frozen)
    with pytest.raises(tessera.Error, match="not C-contiguous"):
        client.pull(t, np.zeros(32, np.float32)[::2])
    with pytest.raises(tessera.Error, match="expected an array"):
        client.push(t, [1.0] * 16)
    with pytest.raises(tessera.Error, match="uint8 is not one Tessera stores"):
        client.push(t, np.zeros(64, np.uint8))
    with pytest.raises(tessera.Error, match="unknown hyper-parameter 'bogus'"):
        client.declare(name + "x", (4,), "f32", "sgd", bogus=1)
    with pytest.raises(tessera.Error, match="learning_rate"):
        client.declare(name + "y", (4,), "f32", "sgd", learning_rate=-1)
    with pytest.raises(tessera.Error, match="update rule 'rmsprop'"):
        client.declare(name + "z", (4,), "f32", "rmsprop")
    with pytest.raises(tessera.Error) as e:
        client.declare(name, (17,), "f32", "add")  # the same name, another shape
    assert name in str(e.value)
    with pytest.raises(tessera.Error, match="'nope'") as e:
        client.find("nope")
    assert e.value.code == "NotFound"
    # The client still works after all of them.
    out = np.zeros(16, np.float32)
    client.pull(t, out)
    assert np.all(out == 1)


def test_futures(client, name):
    t = declare_ready(client, name, BIG)
    grad = np.ones(BIG, np.float32)
    out = np.zeros(BIG, np.float32)
    push = client.push_async(t, grad)
    push.wait()
    assert push.ready and push.dropped == []
    pull = client.pull_async(t, out, min_version=2)
    tessera.wait_all([pull])
    assert np.all(out == 2)

    async def both():
        await client.push_async(t, grad)
        await client.pull_async(t, out, min_version=3)

    asyncio.run(both())
    assert np.all(out == 3)


def test_a_dropped_future_holds_its_arrays_until_complete(client, name):
    t = declare_ready(client, name, BIG)
    # No reference kept to the array or the future: the future hands the
    # array to its client, which holds it until the pull completes, so the
    # fabric never writes freed memory (test_interrupt.py sees it held).
    client.pull_async(t, np.zeros(BIG, np.float32))
    out = np.zeros(BIG, np.float32)
    client.pull(t, out)
    assert np.all(out == 1)


def test_sync_duplicates_are_reported_dropped(client, name):
    t = client.declare(name, (8,), "f32", "add", mode=tessera.sync())
    client.initialize()
    # A sync tensor starts at the step the chief initialised it at: the
    # cluster's global step then (this suite's earlier tests moved it on).
    step = client.start_step
    grad = np.ones(8, np.float32)
    client.push(t, grad, step=step)
    again = client.push_async(t, grad, step=step)
    again.wait()
    assert again.dropped and again.dropped[0][0] == name
    assert again.dropped[0][3] in ("stale", "duplicate")


def test_another_thread_runs_during_a_blocking_pull(client, name):
    # A pull of step s + 1 blocks until step s is pushed, and only the other
    # thread pushes it, after it saw the pull leave: were the GIL held
    # during the wait, that thread could never run and the pull would time out.
    t = client.declare(name, (4,), "f32", "add", mode=tessera.sync())
    client.initialize()
    step = client.start_step
    sent = client.counters().messages_sent
    errors = []

    def push_once_the_pull_left():
        try:
            while client.counters().messages_sent == sent:
                pass
            client.push(t, np.ones(4, np.float32), step=step)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pusher = threading.Thread(target=push_once_the_pull_left)
    pusher.start()
    out = np.zeros(4, np.float32)
    client.pull(t, out, min_step=step + 1)
    pusher.join()
    assert not errors
    assert np.all(out == 1)  # sync: the one worker's gradient, averaged over 1


def test_global_step_and_checkpoint(client, name):
    t = client.declare(name, (4,), "f32", "add", mode=tessera.sync())
    client.initialize()
    start = client.start_step
    for step in range(start, start + 3):
        client.push(t, np.ones(4, np.float32), step=step)
    out = np.zeros(4, np.float32)
    client.pull(t, out, min_step=start + 3)
    assert np.all(out == 3)
    # The shards tell the coordinator of each applied step after the fact.
    deadline = time.monotonic() + 30
    while client.global_step() < start + 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.global_step() >= start + 3
    with pytest.raises(tessera.Error, match="checkpoint"):
        client.save_checkpoint(timeout=30)  # this cluster has no checkpoint directory


def test_closed_client_says_so():
    with tessera.Client.from_env(argv=[]) as c:
        assert c.num_shards == 2
    with pytest.raises(tessera.Error, match="the client is closed"):
        c.global_step()
    for control_call in (c.initialize, c.wait_for_init):
        with pytest.raises(tessera.Error, match="the client is closed"):
            control_call()
