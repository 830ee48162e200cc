"""tessera.torch: a PyTorch module's parameters kept on Tessera's shards.

The optimizer runs on the shards (SGD, momentum, Adam, AdamW, Adagrad, with
PyTorch's definitions), so the trainer holds no optimizer state, and the
loop stays an ordinary PyTorch loop:

    client = tessera.Client.from_env()
    opt = tessera.torch.DistributedOptimizer(client, model, "adam", lr=1e-3)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each gradient is pushed as it is made
        opt.step()                        # the new weights land in param.data

The chief initialises the shards from its module's own values (or the
cluster resumes from a checkpoint); every worker then starts from the
weights on the shards. Gradients are pushed from per-parameter hooks as
backward produces them, so communication overlaps the rest of backward, as
BytePS does (overlap=False pushes them all in step() instead).

With overlap, a gradient has left before the trainer can change it: clipping
(torch.nn.utils.clip_grad_norm_), a GradScaler's unscale_, or any other edit
of .grad between backward and step() would not reach the shards. step()
therefore checks that each pushed .grad is the tensor that was pushed,
unchanged (its version counter), and raises tessera.Error naming the
parameter otherwise; overlap=False pushes .grad as step() finds it, so such
edits take effect.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Iterable

import torch

import tessera

# torch.optim's names -> Tessera's rules; plain SGD with momentum is the
# momentum rule, as in torch.optim.SGD.
_RULES = {"sgd", "momentum", "adam", "adamw", "adagrad"}


# Each rule's state slots on the shards, under torch.optim's names, and the
# rules whose state counts the steps applied (torch.optim's "step").
_STATE_NAMES = {"adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq"),
                "momentum": ("momentum_buffer",), "adagrad": ("sum",)}
_COUNTS_STEPS = {"adam", "adamw", "adagrad"}


# torch.optim's hyper-parameters that Tessera's rules take; a param group's
# other keys (a scheduler's initial_lr, torch's own flags) stay local.
_TORCH_HYPER = {"lr", "betas", "eps", "weight_decay", "momentum", "nesterov",
                "initial_accumulator_value"}


def _hyper(optimizer: str, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """torch.optim keyword arguments -> (Tessera rule, Hyperparams fields)."""
    rule = optimizer.lower()
    if rule not in _RULES:
        raise tessera._invalid(f"optimizer '{optimizer}' is not one of {', '.join(sorted(_RULES))}")
    hyper: dict[str, Any] = {}
    for name, value in options.items():
        if name == "lr":
            hyper["learning_rate"] = value
        elif name == "betas":
            hyper["beta1"], hyper["beta2"] = value
        elif name == "eps":
            hyper["epsilon"] = value
        elif name == "initial_accumulator_value":
            hyper["initial_accumulator"] = value
        else:
            hyper[name] = value
    if rule == "sgd" and hyper.get("momentum", 0) != 0:
        rule = "momentum"
    elif rule == "sgd":
        hyper.pop("momentum", None)
        hyper.pop("nesterov", None)
    return rule, hyper


def _mode(mode: str, staleness: int) -> tessera.ConsistencyMode:
    if mode == "sync":
        return tessera.sync()
    if mode == "async":
        return tessera.asynchronous()
    if mode == "bounded":
        return tessera.bounded(staleness)
    raise tessera._invalid(f"mode '{mode}' is not sync, async or bounded")


class DistributedOptimizer(torch.optim.Optimizer):
    """Keeps `module`'s parameters on the cluster's ps tasks: a
    torch.optim.Optimizer whose update runs on the shards.

    optimizer: "sgd", "momentum", "adam", "adamw" or "adagrad", with
    torch.optim's keyword arguments (lr, betas, eps, weight_decay, momentum,
    nesterov, initial_accumulator_value) as the defaults of every param
    group. param_groups: torch.optim's list of {"params": [...], "lr": ...}
    over `module`'s parameters, each group's hyper-parameters sent to the
    shards for its parameters (default: one group of every parameter that
    requires grad). A change to a group's hyper-parameters (a torch lr
    scheduler's, or by hand) reaches the shards at the next step(), from the
    chief. mode: "sync" (SyncReplicasOptimizer: every worker's step t
    averaged, then applied once), "async" (each push applied on arrival) or
    "bounded" (a worker runs at most `staleness` steps ahead of the slowest).
    Tensor names are `prefix` + the parameter's name.
    """

    def __init__(self, client: tessera.Client, module: torch.nn.Module,
                 optimizer: str = "adam", *, mode: str = "sync", staleness: int = 0,
                 overlap: bool = True, prefix: str = "",
                 param_groups: Iterable[dict[str, Any]] | None = None,
                 restart_timeout: float = 60.0, **optimizer_options: Any):
        self.client = client
        # Sync mode: how long a step waits for a ps task that was lost to
        # come back (restarted in place) before it raises.
        self.restart_timeout = restart_timeout
        self.mode = mode
        self.staleness = staleness
        self._optimizer = optimizer
        _hyper(optimizer, optimizer_options)  # names a bad optimizer or option now
        named = {p: prefix + name for name, p in module.named_parameters()}
        if param_groups is None:
            param_groups = [{"params": [p for p in named if p.requires_grad]}]
        defaults = dict(optimizer_options)
        defaults.setdefault("lr", tessera.Hyperparams().learning_rate)
        super().__init__(list(param_groups), defaults)
        consistency = _mode(mode, staleness)
        self._params: list[tuple[str, torch.nn.Parameter]] = []
        self._group_of: list[int] = []  # each parameter's group
        for g, group in enumerate(self.param_groups):
            # A key the shards would not apply is refused now, not dropped
            # (later keys, a scheduler's initial_lr, stay local).
            unknown = sorted(set(group) - _TORCH_HYPER - {"params"})
            if unknown:
                raise tessera._invalid(f"param group {g}: {', '.join(unknown)} is not a "
                                       f"hyper-parameter the shards apply "
                                       f"({', '.join(sorted(_TORCH_HYPER))})")
            for p in group["params"]:
                if p not in named:
                    raise tessera._invalid(f"param group {g} holds a tensor of shape "
                                           f"{tuple(p.shape)} that is not a parameter of the module")
                self._params.append((named[p], p))
                self._group_of.append(g)
        for name, p in self._params:
            if p.device.type not in ("cpu", "cuda") or not p.data.is_contiguous():
                raise tessera._invalid(f"parameter '{name}' is not a contiguous CPU or CUDA tensor")
        # What each group's hyper-parameters were when last sent.
        self._sent = [self._group_hyper(group) for group in self.param_groups]
        # Every worker declares the same tensors; only the chief's initial
        # values are used.
        specs = []
        for (name, p), g in zip(self._params, self._group_of):
            rule, hyper = self._sent[g]
            specs.append(tessera.spec(name, tuple(p.shape), p.dtype, rule, mode=consistency,
                                      initial=p.data.detach().cpu().contiguous(), **hyper))
        self.tensors = client.declare_many(specs)
        if client.is_chief:
            client.initialize()
        else:
            client.wait_for_init()
        self.restored_step = client.restored_step
        # Every worker starts at the step the chief initialised the tensors
        # at (a resumed cluster: the restored global step), and from the
        # shards' weights.
        self.step_count = client.start_step if mode != "async" else 0
        client.pull(self._weights(), min_step=self.step_count)
        self._pending: dict[int, tessera.Future] = {}
        # What each push from backward sent: the .grad tensor and its version
        # then, which an in-place edit moves on.
        self._pushed: dict[int, tuple[torch.Tensor, int]] = {}
        self._zeros: dict[int, torch.Tensor] = {}
        self._hooks = []
        self._grad_accumulators = []
        if overlap:
            for i, (_, p) in enumerate(self._params):
                # The hook of the parameter's gradient accumulator runs once
                # .grad holds the new gradient (Horovod's way): the tensor
                # pushed is .grad itself, so step() can tell if it changed.
                with torch.enable_grad():  # also when made under torch.no_grad()
                    accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                self._grad_accumulators.append(accumulator)  # keeps the node alive
                self._hooks.append(accumulator.register_hook(self._hook(i)))

    # -- the ordinary torch.optim surface ---------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self._params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()

    def step(self, closure: Any = None) -> None:
        """Pushes what backward has not pushed yet, waits for every push, then
        pulls the weights this step produced into each param.data. A group
        whose hyper-parameters changed since the last step (an lr scheduler)
        sends them first (the chief; the others' groups follow the chief's).
        A closure is refused: the loss is computed before step(), as
        overlapped pushes need."""
        if closure is not None:
            raise tessera._invalid("DistributedOptimizer.step takes no closure "
                                   "(LBFGS-style re-evaluation would push again)")
        self._send_changed_hyperparams()
        tag = None if self.mode == "async" else self.step_count
        missing = self._gradients(skip=self._pending)
        futures = list(self._pending.values())
        if missing:
            futures.append(self.client.push_async(missing, step=tag))
        self._pending = {}
        pushed, self._pushed = self._pushed, {}
        try:
            tessera.wait_all(futures)
        except tessera.Error as e:
            # A ps task lost: every gradient again once it is back (the
            # other shards drop what they took already as duplicates).
            self._after_restart(e, lambda: self.client.push(self._gradients(), step=tag))
        self._check_unchanged(pushed)
        self.step_count += 1
        if self.mode == "sync":
            weights = self._weights()
            try:
                self.client.pull(weights, min_step=self.step_count)
            except tessera.Error as e:
                self._after_restart(
                    e, lambda: self.client.pull(weights, min_step=self.step_count))
        elif self.mode == "bounded":
            self.client.pull(self._weights(),
                             min_step=max(0, self.step_count - self.staleness))
        else:
            self.client.pull(self._weights())

    def set_hyperparams(self, **optimizer_options: Any) -> None:
        """Chief only: new hyper-parameters (a learning-rate schedule) for every
        param group from the next update on, e.g. set_hyperparams(lr=1e-4);
        sent at once."""
        _hyper(self._optimizer, optimizer_options)  # names a bad one
        if not self.client.is_chief:
            raise tessera._invalid("set_hyperparams: only the chief sets hyper-parameters "
                                   "(every worker's lr scheduler may run; the chief's is sent)")
        for group in self.param_groups:
            group.update(optimizer_options)
        self._send_changed_hyperparams()

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's, with each parameter's state read from the shards,
        under torch.optim's names: Adam's and AdamW's exp_avg, exp_avg_sq and
        step, SGD's momentum_buffer, Adagrad's sum and step (plain SGD keeps
        none). The moments come in the shards' compute type (f64 for f64
        parameters, else f32). Any worker may call it; it waits for the
        pushes under way, so that it holds a whole step."""
        tessera.wait_all(list(self._pending.values()))
        packed = super().state_dict()
        state: dict[int, dict[str, Any]] = {}
        for i, t in enumerate(self.tensors):
            rule = self._sent[self._group_of[i]][0]
            names = _STATE_NAMES.get(rule, ())
            entry: dict[str, Any] = {}
            for slot, key in enumerate(names):
                values, updates = self.client.optimizer_state(t, slot)
                entry[key] = torch.from_numpy(values)
            if names and rule in _COUNTS_STEPS:
                entry["step"] = torch.tensor(float(updates))
            if entry:
                state[i] = entry
        packed["state"] = state
        return packed

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim's: the param groups' hyper-parameters (sent at the next
        step), and each parameter's state written to the shards by the chief
        (every worker may call it; the others' state is the cluster's, set
        by the chief). A state entry torch.optim would keep that the rule
        has no place for, or of another shape, is refused, naming it."""
        super().load_state_dict(state_dict)
        loaded = {i: self.state.pop(p) for i, (_, p) in enumerate(self._params) if p in self.state}
        self.state.clear()  # the state lives on the shards
        for i, entry in loaded.items():
            name, p = self._params[i]
            rule = self._sent[self._group_of[i]][0]
            names = _STATE_NAMES.get(rule, ())
            unknown = sorted(set(entry) - set(names) - {"step"})
            if unknown:
                raise tessera._invalid(f"state of '{name}': {', '.join(unknown)} has no place "
                                       f"in the shards' {rule} state ({', '.join(names) or 'none'})")
            if not self.client.is_chief:
                continue
            updates = int(entry["step"]) if "step" in entry else 0
            wide = p.dtype == torch.float64
            for slot, key in enumerate(names):
                if key not in entry:
                    continue
                values = entry[key].detach().to("cpu", torch.float64 if wide else torch.float32)
                self.client.set_optimizer_state(self.tensors[i], slot,
                                                values.contiguous().numpy(), updates)

    def _group_hyper(self, group: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return _hyper(self._optimizer, {k: v for k, v in group.items() if k in _TORCH_HYPER})

    def _send_changed_hyperparams(self) -> None:
        for g, group in enumerate(self.param_groups):
            now = self._group_hyper(group)
            if now == self._sent[g]:
                continue
            if now[0] != self._sent[g][0]:
                raise tessera._invalid(
                    f"param group {g} would change its rule from {self._sent[g][0]} to "
                    f"{now[0]} (momentum 0 and non-zero are two rules); a tensor keeps its rule")
            if self.client.is_chief:
                for t, gi in zip(self.tensors, self._group_of):
                    if gi == g:
                        self.client.set_hyperparams(t, **now[1])
            self._sent[g] = now

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._grad_accumulators = []

    # -- internals ----------------------------------------------------------
    def _gradients(self, skip: Any = ()) -> dict[tessera.Tensor, torch.Tensor]:
        """Each parameter's .grad (zeros where backward left none), but
        those whose index is in `skip`."""
        return {t: (p.grad if p.grad is not None else self._zero(i, p)).detach().contiguous()
                for i, (t, (_, p)) in enumerate(zip(self.tensors, self._params)) if i not in skip}

    def _after_restart(self, error: tessera.Error, again: Any) -> None:
        """Sync mode: a call that failed because a ps task was lost
        ('Unavailable') is made again, until the task is back (restarted in
        place, restored from the checkpoint: training.md) or
        restart_timeout passed; any other error is raised as it is. Not in
        async or bounded mode, where a push the other shards applied would
        apply twice."""
        if error.code != "Unavailable" or self.mode != "sync" or self.restart_timeout <= 0:
            raise error
        deadline = time.monotonic() + self.restart_timeout
        while True:
            time.sleep(0.2)  # the client tries the lost task again on each call
            try:
                return again()
            except tessera.Error as e:
                if e.code != "Unavailable" or time.monotonic() > deadline:
                    if e.code == "Unavailable":
                        e.add_note(f"a ps task lost at step {self.step_count} did not come "
                                   f"back within restart_timeout={self.restart_timeout:g} s")
                    raise e from error

    def _weights(self) -> dict[tessera.Tensor, torch.Tensor]:
        return {t: p.data for t, (_, p) in zip(self.tensors, self._params)}

    def _zero(self, i: int, p: torch.Tensor) -> torch.Tensor:
        # Sync steps need every worker's push of every tensor: a parameter
        # this batch did not touch pushes zeros.
        if i not in self._zeros:
            self._zeros[i] = torch.zeros_like(p.data)
        return self._zeros[i]

    def _hook(self, i: int):
        # A weak reference: the module's parameters must not keep the
        # optimizer (and its client) alive through their hooks.
        self_ref = weakref.ref(self)

        def push_now(*_: Any) -> None:
            opt = self_ref()
            if opt is not None:
                opt._push_from_backward(i)
        return push_now

    def _push_from_backward(self, i: int) -> None:
        if i in self._pending:
            # This step's push of the parameter left with the first backward;
            # a second one's gradient would be lost.
            raise tessera._invalid(
                f"a second backward before step() for '{self._params[i][0]}': "
                "gradient accumulation needs overlap=False")
        if not self._pending:
            # The step's first push: its hyper-parameters go first (an lr
            # scheduler stepped since the last step()).
            self._send_changed_hyperparams()
        grad = self._params[i][1].grad
        tag = None if self.mode == "async" else self.step_count
        self._pushed[i] = (grad, grad._version)
        self._pending[i] = self.client.push_async(
            self.tensors[i], grad.detach().contiguous(), step=tag)

    def _check_unchanged(self, pushed: dict[int, tuple[torch.Tensor, int]]) -> None:
        changed = [self._params[i][0] for i, (grad, version) in sorted(pushed.items())
                   if self._params[i][1].grad is not grad or grad._version != version]
        if changed:
            others = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise tessera._invalid(
                f"the .grad of '{changed[0]}'{others} changed after backward pushed it "
                "(clipping, a GradScaler's unscale_, or another edit or replacement of "
                ".grad): with overlap=True each gradient leaves as backward makes it, so "
                "the change did not reach the shards; pass overlap=False to "
                "DistributedOptimizer to change gradients before step()")

    def __iter__(self) -> Iterable[tuple[str, tessera.Tensor]]:
        return iter(zip((n for n, _ in self._params), self.tensors))
