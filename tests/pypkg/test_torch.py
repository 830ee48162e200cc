"""PyTorch tensors and DLPack producers through tessera.Client, and
tessera.torch.DistributedOptimizer against torch.optim on the same model."""

import copy

import numpy as np
import pytest
import torch

import tessera
import tessera.torch

BIG = (5 << 20) // 4


def test_torch_tensors_move_in_place(client, name):
    t = client.declare(name, (BIG,), "f32", "add", initializer=tessera.constant(1.0))
    client.initialize()
    out = torch.zeros(BIG)
    address = out.data_ptr()
    before = client.counters()
    client.pull(t, out)
    client.push(t, torch.ones(BIG))
    client.pull(t, out, min_version=2)
    after = client.counters()
    assert out.data_ptr() == address
    assert torch.all(out == 2)
    assert after.get_bytes - before.get_bytes == 2 * out.numel() * 4
    assert after.put_bytes - before.put_bytes == out.numel() * 4


class DLPackOnly:
    """A producer that speaks only the DLPack protocol, as JAX's arrays do."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None, **kwargs):
        return self.tensor.__dlpack__()

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def test_any_dlpack_producer(client, name):
    t = client.declare(name, (64,), "f32", "assign")
    client.initialize()
    client.push(t, DLPackOnly(torch.arange(64, dtype=torch.float32)))
    out = torch.zeros(64)
    client.pull(t, DLPackOnly(out), min_version=2)
    assert torch.equal(out, torch.arange(64, dtype=torch.float32))


def test_half_precision_tensors(client, name):
    for dtype in (torch.float16, torch.bfloat16):
        t = client.declare(f"{name}-{dtype}", (8,), dtype, "assign")
        client.initialize()
        client.push(t, torch.full((8,), 1.5, dtype=dtype))
        out = torch.zeros(8, dtype=dtype)
        client.pull(t, out, min_version=2)
        assert torch.all(out == 1.5)
        assert client.info(t).dtype == tessera._dtype(dtype)


def test_a_parameter_is_written_in_place_as_its_data_would_be(client, name):
    t = client.declare(name, (4,), "f32", "assign", initializer=tessera.constant(3.0))
    client.initialize()
    p = torch.nn.Parameter(torch.zeros(4))
    client.pull(t, p)
    assert p.requires_grad and torch.all(p.detach() == 3)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(steps)]


OPTIMIZERS = [
    ("sgd", torch.optim.SGD, dict(lr=0.1, weight_decay=0.01)),
    ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("adam", torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.001)),
    ("adamw", torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    ("adagrad", torch.optim.Adagrad, dict(lr=0.1, eps=1e-10, initial_accumulator_value=0.1)),
]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "after-backward"])
@pytest.mark.parametrize("rule,local_optimizer,options", OPTIMIZERS,
                         ids=[f"{o[0]}{i}" for i, o in enumerate(OPTIMIZERS)])
def test_optimizer_on_the_shards_matches_torch_optim(client, name, rule, local_optimizer,
                                                     options, overlap):
    remote = make_model()
    local = copy.deepcopy(remote)
    opt = tessera.torch.DistributedOptimizer(client, remote, rule, prefix=name + "/",
                                             overlap=overlap, **options)
    start = opt.step_count  # where the chief initialised it: earlier tests moved it on
    assert start == client.start_step
    local_opt = local_optimizer(local.parameters(), **options)
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in batches(4):
        for model, o in ((remote, opt), (local, local_opt)):
            o.zero_grad()
            loss_fn(model(x), y).backward()
            if o is opt and overlap:
                assert len(opt._pending) == 4, "backward's hooks pushed every gradient"
            o.step()
    for (n, a), b in zip(remote.named_parameters(), local.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), n
    assert opt.step_count == start + 4


@pytest.mark.parametrize("mode", ["async", "bounded"])
def test_async_and_bounded_modes_train(client, name, mode):
    model = make_model()
    opt = tessera.torch.DistributedOptimizer(client, model, "adam", prefix=name + "/",
                                             mode=mode, staleness=1, lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = batches(1)
    losses = []
    for _ in range(30):
        x, y = data[0]
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2


def test_second_backward_with_overlap_is_an_error(client, name):
    model = make_model()
    opt = tessera.torch.DistributedOptimizer(client, model, "sgd", prefix=name + "/", lr=0.1)
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(tessera.Error, match="overlap=False"):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    tessera.wait_all(list(opt._pending.values()))
    opt.remove_hooks()


def clip_every_grad(model):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)


def replace_the_last_grad(model):
    last = list(model.parameters())[-1]
    last.grad = last.grad * 0.5  # a new tensor, not an in-place edit


@pytest.mark.parametrize("edit,refusal", [
    (clip_every_grad, r"the .grad of '.*/0.weight' \(and 3 more\) changed after backward "
                      r"pushed it.*overlap=False"),
    (replace_the_last_grad, r"the .grad of '.*/2.bias' changed"),
], ids=["clipped", "replaced"])
def test_a_grad_edited_after_an_overlapped_backward_is_refused(client, name, edit, refusal):
    # The gradients left during backward: clipping (or any edit) after it
    # changes nothing the shards see, so step() says so instead of moving
    # the weights by the unedited gradient in silence.
    model = make_model()
    opt = tessera.torch.DistributedOptimizer(client, model, "sgd", prefix=name + "/", lr=0.1)
    x, y = batches(1)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    edit(model)
    with pytest.raises(tessera.Error, match=refusal):
        opt.step()
    assert not opt._pending  # every push was waited for before the error
    opt.remove_hooks()


def test_clipping_without_overlap_matches_torch_optim(client, name):
    remote = make_model()
    local = copy.deepcopy(remote)
    opt = tessera.torch.DistributedOptimizer(client, remote, "sgd", prefix=name + "/",
                                             overlap=False, lr=0.5)
    local_opt = torch.optim.SGD(local.parameters(), lr=0.5)
    loss_fn = torch.nn.CrossEntropyLoss()
    moved = 0.0
    for x, y in batches(3):
        for model, o in ((remote, opt), (local, local_opt)):
            o.zero_grad()
            loss_fn(model(x), y).backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            assert norm > 1e-2  # the clip bites: unclipped steps would be 10x larger
            before = [p.detach().clone() for p in model.parameters()]
            o.step()
            if o is opt:
                moved = max(moved, max((p.detach() - b).abs().max().item()
                                       for p, b in zip(model.parameters(), before)))
    for (n, a), b in zip(remote.named_parameters(), local.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), n
    assert moved <= 0.5 * 1e-3 * 1.0001  # lr times the clipped norm bounds each step


def test_unknown_optimizer_and_mode():
    with pytest.raises(tessera.Error, match="optimizer 'rmsprop'"):
        tessera.torch._hyper("rmsprop", {})
    with pytest.raises(tessera.Error, match="mode 'eventual'"):
        tessera.torch._mode("eventual", 0)


def test_numpy_interop_with_torch_views(client, name):
    # A torch tensor and a NumPy view of the same memory are the same buffer.
    t = client.declare(name, (16,), "f32", "assign")
    client.initialize()
    out = torch.zeros(16)
    view = out.numpy()
    client.push(t, np.arange(16, dtype=np.float32))
    client.pull(t, view, min_version=2)
    assert torch.equal(out, torch.arange(16, dtype=torch.float32))


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="this torch has no usable CUDA device (Debian's python3-torch is "
                           "CPU-only); the GPU paths are tested in C++ by gpu-shard")
def test_cuda_tensors_take_the_gpu_paths(name):
    # The cluster's shards hold host memory: a CUDA tensor is staged
    # through host memory where allowed, and every byte is counted.
    with tessera.Client.from_env(argv=[], allow_host_staging=True) as c:
        t = c.declare(name, (1 << 18,), "f32", "add", initializer=tessera.constant(2.0))
        c.initialize()
        out = torch.zeros(1 << 18, device="cuda")
        c.push(t, torch.ones(1 << 18, device="cuda"))
        c.pull(t, out, min_version=2)
        assert torch.all(out == 3)
        counters = c.counters()
        assert counters.host_staged_bytes + counters.cuda_ipc_bytes >= 2 * out.numel() * 4


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "after-backward"])
def test_param_groups_and_an_lr_scheduler_match_torch_optim(client, name, overlap):
    remote = make_model()
    local = copy.deepcopy(remote)

    def groups(model):  # the first layer at its own lr and weight decay
        first, second = model[0], model[2]
        return [{"params": list(first.parameters()), "lr": 0.05, "weight_decay": 0.01},
                {"params": list(second.parameters())}]
    opt = tessera.torch.DistributedOptimizer(client, remote, "adam", prefix=name + "/",
                                             overlap=overlap, param_groups=groups(remote),
                                             lr=0.01)
    assert isinstance(opt, torch.optim.Optimizer)
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.01]
    local_opt = torch.optim.Adam(groups(local), lr=0.01)
    schedules = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.1)
                 for o in (opt, local_opt)]
    loss_fn = torch.nn.CrossEntropyLoss()
    for x, y in batches(5):
        for model, o, schedule in ((remote, opt, schedules[0]), (local, local_opt, schedules[1])):
            o.zero_grad()
            loss_fn(model(x), y).backward()
            o.step()
            schedule.step()
    for (n, a), b in zip(remote.named_parameters(), local.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), n
    # The shards hold the schedule's last lr (0.05 and 0.01 times 0.1^2).
    info = client.info(opt.tensors[0])
    assert info.hyper.learning_rate == pytest.approx(0.0005)
    assert client.info(opt.tensors[-1]).hyper.learning_rate == pytest.approx(0.0001)
    opt.remove_hooks()


def test_a_param_group_of_another_module_is_refused(client, name):
    model, stranger = make_model(), make_model()
    with pytest.raises(tessera.Error, match="param group 0 holds a tensor of shape"):
        tessera.torch.DistributedOptimizer(client, model, "sgd", prefix=name + "/",
                                           param_groups=[{"params": stranger.parameters()}])
    # A group key the shards would not apply is refused, not dropped.
    with pytest.raises(tessera.Error, match="param group 0: amsgrad is not a hyper-parameter"):
        tessera.torch.DistributedOptimizer(
            client, model, "adam", prefix=name + "/",
            param_groups=[{"params": model.parameters(), "amsgrad": True}])


def _torch_state(packed):
    """A state_dict's per-parameter state without torch's placeholders
    (plain SGD keeps momentum_buffer None)."""
    state = {}
    for i, entry in packed["state"].items():
        kept = {k: v for k, v in entry.items() if v is not None}
        if kept:
            state[i] = kept
    return state


@pytest.mark.parametrize("rule,local_optimizer,options", OPTIMIZERS,
                         ids=[f"{o[0]}{i}" for i, o in enumerate(OPTIMIZERS)])
def test_state_dict_holds_the_shards_state_as_torch_optim_does(client, name, rule,
                                                                 local_optimizer, options):
    remote = make_model()
    local = copy.deepcopy(remote)
    opt = tessera.torch.DistributedOptimizer(client, remote, rule, prefix=name + "/a/", **options)
    local_opt = local_optimizer(local.parameters(), **options)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = batches(6)

    def train(pairs, steps):
        for x, y in steps:
            for model, o in pairs:
                o.zero_grad()
                loss_fn(model(x), y).backward()
                o.step()
    train(((remote, opt), (local, local_opt)), data[:3])
    got, want = opt.state_dict(), local_opt.state_dict()
    want_state = _torch_state(want)
    assert got["state"].keys() == want_state.keys()
    for i, entry in want_state.items():
        assert got["state"][i].keys() == entry.keys(), i
        for key, value in entry.items():
            assert torch.allclose(got["state"][i][key].double(), value.double(),
                                  atol=1e-6, rtol=1e-4), (i, key)
    # Loaded into a new optimizer (new tensors, the weights after those
    # steps), training goes on as torch.optim's.
    fresh = copy.deepcopy(remote)
    opt2 = tessera.torch.DistributedOptimizer(client, fresh, rule, prefix=name + "/b/", **options)
    opt2.load_state_dict(got)
    reloaded = opt2.state_dict()["state"]
    for i, entry in got["state"].items():
        for key, value in entry.items():
            assert torch.equal(reloaded[i][key], value), (i, key)
    train(((fresh, opt2), (local, local_opt)), data[3:])
    for (n, a), b in zip(fresh.named_parameters(), local.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), n
    opt.remove_hooks()
    opt2.remove_hooks()


def test_a_state_entry_with_no_place_on_the_shards_is_refused(client, name):
    model = make_model()
    opt = tessera.torch.DistributedOptimizer(client, model, "adam", prefix=name + "/", lr=0.01)
    packed = opt.state_dict()
    packed["state"][0]["max_exp_avg_sq"] = packed["state"][0]["exp_avg"].clone()  # amsgrad's
    with pytest.raises(tessera.Error, match="max_exp_avg_sq has no place in the shards' adam"):
        opt.load_state_dict(packed)
    opt.remove_hooks()
