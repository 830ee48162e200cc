"""Values that would change the result are refused by name, never used as
something else: an array of another shape, and a Tensor of another client."""

import numpy as np
import pytest

import tessera


def test_an_array_of_the_same_bytes_in_another_shape_is_refused(client, name):
    flat = client.declare(name + "/flat", (8,), "f32", "assign")
    square = client.declare(name + "/square", (2, 4), "f32", "assign")
    client.initialize()
    assert flat.shape == (8,) and square.shape == (2, 4)
    with pytest.raises(tessera.Error, match=r"gradient of tensor '.*/flat': an array of shape "
                       r"\(2, 4\), but the tensor's shape is \[8\]"):
        client.push(flat, np.ones((2, 4), np.float32))
    with pytest.raises(tessera.Error, match=r"output of tensor '.*/square': an array of shape "
                       r"\(4, 2\), but the tensor's shape is \[2, 4\]"):
        client.pull(square, np.zeros((4, 2), np.float32))
    with pytest.raises(tessera.Error, match=r"weights of tensor '.*/square'.*\(1, 8\)"):
        client.push_pull(square, np.ones((2, 4), np.float32), np.zeros((1, 8), np.float32))
    # The tensor's own shape, or flat (1-D) of its element count, as
    # docs/python.md says.
    client.push(square, np.arange(8, dtype=np.float32).reshape(2, 4))
    out = np.zeros((2, 4), np.float32)
    client.pull(square, out, min_version=2)
    flat_out = np.zeros(8, np.float32)
    client.pull(square, flat_out, min_version=2)
    assert out.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert flat_out.tolist() == list(range(8))
    # A found tensor knows its shape too.
    assert client.find(name + "/square").shape == (2, 4)


def test_a_closed_clients_tensor_is_refused_by_the_next_client(client, name):
    with tessera.Client.from_env(argv=[]) as first:
        stale = first.declare(name + "/a", (4,), "f32", "add")
    with tessera.Client.from_env(argv=[]) as following:
        fresh = following.declare(name + "/b", (4,), "f32", "add")
        # The same index: only the client tells the two apart.
        assert fresh.index == stale.index and fresh != stale
        with pytest.raises(tessera.Error, match="belongs to another client") as e:
            following.pull(stale, np.zeros(4, np.float32))
        assert e.value.code == "InvalidArgument"
        with pytest.raises(tessera.Error, match="belongs to another client"):
            following.push(stale, np.zeros(4, np.float32))
        with pytest.raises(tessera.Error, match="belongs to another client"):
            following.info(stale)
    # And the session's own client refuses both.
    with pytest.raises(tessera.Error, match="belongs to another client"):
        client.info(fresh)


def test_a_name_where_a_tensor_goes_says_so(client):
    with pytest.raises(tessera.Error, match=r"push: 'no/such' is a name; pass its Tensor"):
        client.push("no/such", np.zeros(4, np.float32))
    with pytest.raises(tessera.Error, match=r"pull: 'no/such' is a name"):
        client.pull("no/such", np.zeros(4, np.float32))


def test_a_retry_bound_past_the_op_timeout_is_refused(client):
    # retry_lost_shard_within (seconds, as op_timeout): every wait ends at
    # op_timeout, so a longer bound could only keep a call going unseen.
    with pytest.raises(tessera.Error, match=r"retry_lost_shard_within \(90000 ms\) exceeds "
                       r"op_timeout \(60000 ms\)"):
        tessera.Client.from_env(argv=[], op_timeout=60, retry_lost_shard_within=90)
    with tessera.Client.from_env(argv=[], op_timeout=60, retry_lost_shard_within=30) as c:
        assert c.num_shards == client.num_shards
