"""Tessera: a parameter store for distributed training over RDMA.

The Python face of tessera::Client (docs/python.md). Arrays move without
copies: NumPy arrays, PyTorch tensors and any DLPack producer (JAX, CuPy)
are read and written where they are, host memory one-sided from and into
the caller's buffer, CUDA memory by the GPU paths where they were built.
Every wait and transfer releases the GIL; a failed call raises
tessera.Error with the Status text.

    import tessera
    client = tessera.Client.from_env()          # TF_CONFIG or TF1 flags
    w = client.declare("w", (784, 10), rule="adam", mode=tessera.sync(),
                       learning_rate=1e-3)
    client.initialize() if client.is_chief else client.wait_for_init()
    client.push(w, grad, step=t)
    client.pull(w, weights, min_step=t + 1)
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Iterable, Mapping, Sequence, Union

from . import _tessera
from ._tessera import (
    ClientOptions,
    Consistency,
    ConsistencyMode,
    Counters,
    DType,
    Error,
    Future,
    Hyperparams,
    Initializer,
    Tensor,
    TensorInfo,
    TensorSpec,
    UpdateRule,
    wait_all,
)

__version__ = _tessera.__version__

__all__ = [
    "Client", "ClientOptions", "Consistency", "ConsistencyMode", "Counters", "DType", "Error",
    "Future", "Hyperparams", "Initializer", "Tensor", "TensorInfo", "TensorSpec", "UpdateRule",
    "asynchronous", "bounded", "sync", "hyperparams", "spec", "wait_all",
    "zeros", "constant", "uniform", "normal", "truncated_normal", "glorot_uniform",
    "glorot_normal",
]

# --- consistency modes (TensorFlow's words) ---------------------------------


def asynchronous() -> ConsistencyMode:
    """Every push applies on arrival (TensorFlow's default)."""
    return ConsistencyMode()


def sync(replicas_to_aggregate: int = 0, total_num_replicas: int = 0,
         average: bool = True) -> ConsistencyMode:
    """SyncReplicasOptimizer: step t applies once replicas_to_aggregate workers
    pushed it (0: every worker), averaged (or summed); late pushes are dropped."""
    m = ConsistencyMode()
    m.kind = Consistency.SYNC
    m.replicas_to_aggregate = replicas_to_aggregate
    m.total_num_replicas = total_num_replicas
    m.average = average
    return m


def bounded(staleness: int, total_num_replicas: int = 0) -> ConsistencyMode:
    """Stale-synchronous: a worker at step t pulls once every worker pushed t - s."""
    m = ConsistencyMode()
    m.kind = Consistency.BOUNDED
    m.staleness = staleness
    m.total_num_replicas = total_num_replicas
    return m


# --- initializers (tf.keras.initializers) -----------------------------------


def _initializer(kind: Initializer.Kind, **fields: Any) -> Initializer:
    init = Initializer()
    init.kind = kind
    for name, value in fields.items():
        setattr(init, name, value)
    return init


def zeros() -> Initializer:
    return Initializer()


def constant(value: float) -> Initializer:
    return _initializer(Initializer.Kind.CONSTANT, value=value)


def uniform(low: float = -0.05, high: float = 0.05, seed: int = 0) -> Initializer:
    return _initializer(Initializer.Kind.UNIFORM, low=low, high=high, seed=seed)


def normal(mean: float = 0.0, stddev: float = 0.05, seed: int = 0) -> Initializer:
    return _initializer(Initializer.Kind.NORMAL, mean=mean, stddev=stddev, seed=seed)


def truncated_normal(mean: float = 0.0, stddev: float = 0.05, seed: int = 0) -> Initializer:
    return _initializer(Initializer.Kind.TRUNCATED_NORMAL, mean=mean, stddev=stddev, seed=seed)


def glorot_uniform(seed: int = 0) -> Initializer:
    return _initializer(Initializer.Kind.GLOROT_UNIFORM, seed=seed)


def glorot_normal(seed: int = 0) -> Initializer:
    return _initializer(Initializer.Kind.GLOROT_NORMAL, seed=seed)


def _invalid(message: str) -> Error:
    """tessera.Error as the C++ side raises it for InvalidArgument."""
    error = Error("InvalidArgument: " + message)
    error.code = "InvalidArgument"
    return error


# --- names users bring ------------------------------------------------------

_DTYPES = {
    "f32": DType.F32, "float32": DType.F32, "float": DType.F32,
    "f64": DType.F64, "float64": DType.F64, "double": DType.F64,
    "f16": DType.F16, "float16": DType.F16, "half": DType.F16,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
    "i32": DType.I32, "int32": DType.I32,
    "i64": DType.I64, "int64": DType.I64,
}

_RULES = {
    "assign": UpdateRule.ASSIGN, "add": UpdateRule.ADD, "sgd": UpdateRule.SGD,
    "momentum": UpdateRule.MOMENTUM, "adam": UpdateRule.ADAM, "adamw": UpdateRule.ADAMW,
    "adagrad": UpdateRule.ADAGRAD,
}


def _dtype(d: Any) -> DType:
    """DType from a DType, a name ('f32', 'float32'), or a NumPy or PyTorch dtype."""
    if isinstance(d, DType):
        return d
    name = str(d)
    if not isinstance(d, str):
        name = getattr(d, "name", None) or name.removeprefix("torch.")
        # np.float32 (a type) has __name__, np.dtype('float32') has name.
        name = getattr(d, "__name__", name) if isinstance(d, type) else name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise _invalid(f"dtype {d!r} is not one Tessera stores "
                    "(f32, f64, f16, bf16, i32, i64)") from None


def _rule(r: Union[str, UpdateRule]) -> UpdateRule:
    if isinstance(r, UpdateRule):
        return r
    try:
        return _RULES[str(r).lower()]
    except KeyError:
        raise _invalid(f"update rule {r!r} is not one of "
                    f"{', '.join(_RULES)}") from None


def hyperparams(**values: Any) -> Hyperparams:
    """Hyperparams(learning_rate=..., weight_decay=..., momentum=..., nesterov=...,
    beta1=..., beta2=..., epsilon=..., initial_accumulator=...); TensorFlow's
    `lr`/`eps` spellings are accepted too."""
    h = Hyperparams()
    aliases = {"lr": "learning_rate", "eps": "epsilon"}
    for name, value in values.items():
        field = aliases.get(name, name)
        if field.startswith("_") or not hasattr(h, field):
            raise _invalid(f"unknown hyper-parameter '{name}'")
        setattr(h, field, value)
    h.validate()
    return h


def spec(name: str, shape: Sequence[int], dtype: Any = "f32", rule: Any = "assign", *,
         mode: ConsistencyMode | None = None, initial: Any = None,
         initializer: Initializer | None = None, pin_shard: int | None = None,
         **hyper: Any) -> TensorSpec:
    """A TensorSpec; hyper-parameters as keywords (learning_rate=1e-3)."""
    s = TensorSpec()
    s.name = name
    s.shape = [int(d) for d in shape]
    s.dtype = _dtype(dtype)
    s.rule = _rule(rule)
    if mode is not None:
        s.mode = mode
    if initializer is not None:
        s.initializer = initializer
    if pin_shard is not None:
        s.pinned_shard = pin_shard
    if hyper:
        s.hyper = hyperparams(**hyper)
    if initial is not None:
        s.set_initial(initial)
    return s


# --- the client -------------------------------------------------------------

Items = Union[Tensor, Mapping[Tensor, Any], Iterable[tuple]]


def _pairs(items: Items, array: Any, what: str) -> Any:
    if isinstance(items, str):
        raise _invalid(f"{what}: '{items}' is a name; pass its Tensor "
                       f"(client.declare(...) or client.find('{items}'))")
    if isinstance(items, Tensor):
        if array is None:
            raise _invalid(f"{what} of tensor '{items.name}' needs an array")
        return ((items, array),)
    if array is not None:
        raise _invalid(f"{what}: an array goes with a single Tensor, "
                    "not with a list or dict of items")
    if isinstance(items, Mapping):
        return tuple(items.items())
    return items


class Client:
    """A worker's connection to the cluster (tessera::Client).

    Blocking calls wait without the GIL; the *_async calls return a Future
    that is awaitable and has .wait(). Arrays given to a call are used in
    place: do not change or free them until the call is complete.
    """

    def __init__(self, options: ClientOptions):
        self._c = _tessera.Client(options)

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, **options: Any) -> "Client":
        """Connects as TF_CONFIG (or TensorFlow 1's flags in argv, default
        sys.argv) says, with TESSERA_SECRET/TESSERA_SECRET_FILE and
        TESSERA_TRANSPORT; keywords set ClientOptions fields
        (op_timeout=30, inline_bytes=0, ...)."""
        opts = ClientOptions.from_env(list(sys.argv if argv is None else argv))
        for name, value in options.items():
            if name.startswith("_") or not hasattr(opts, name):
                raise _invalid(f"unknown client option '{name}'")
            setattr(opts, name, value)
        return cls(opts)

    # lifetime
    def close(self) -> None:
        """Disconnects; calls still pending fail with Aborted."""
        self._c.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # tensors
    def declare(self, name: str, shape: Sequence[int], dtype: Any = "f32",
                rule: Any = "assign", **kwargs: Any) -> Tensor:
        """Declares a tensor (every worker declares the same ones); see spec()."""
        return self._c.declare_many([spec(name, shape, dtype, rule, **kwargs)])[0]

    def declare_many(self, specs: Sequence[TensorSpec]) -> list[Tensor]:
        """Declares several in one round trip to the coordinator."""
        return self._c.declare_many(list(specs))

    def declare_async(self, name: str, shape: Sequence[int], dtype: Any = "f32",
                      rule: Any = "assign", **kwargs: Any) -> Future:
        """declare() without waiting: the Future's result() (or await) is [Tensor].
        Control calls (declare, initialize, wait_for_init, blocking or not) run
        one at a time in the order made; one still queued can be cancel()ed."""
        return self._c.declare_many_async([spec(name, shape, dtype, rule, **kwargs)])

    def declare_many_async(self, specs: Sequence[TensorSpec]) -> Future:
        return self._c.declare_many_async(list(specs))

    def find(self, name: str) -> Tensor:
        return self._c.find(name)

    def info(self, tensor: Tensor) -> TensorInfo:
        return self._c.info(tensor)

    # initialisation
    @property
    def is_chief(self) -> bool:
        return self._c.is_chief

    def initialize(self) -> None:
        """Chief only: writes the declared tensors' initial values."""
        self._c.initialize()

    def initialize_async(self) -> Future:
        return self._c.initialize_async()

    def wait_for_init(self, timeout: float = 60.0) -> None:
        self._c.wait_for_init(timeout)

    def wait_for_init_async(self, timeout: float = 60.0) -> Future:
        return self._c.wait_for_init_async(timeout)

    @property
    def read_only(self) -> bool:
        """A reader (ClientOptions.read_only: an evaluator, an inference
        server): it declares (looks up) tensors and pulls; it never writes."""
        return self._c.read_only

    @property
    def worker_rank(self) -> int:
        """This worker's rank among all workers (the chief is 0)."""
        return self._c.worker_rank

    @property
    def num_workers(self) -> int:
        return self._c.num_workers

    @property
    def restored_step(self) -> int | None:
        """The global step of the checkpoint the cluster resumed from, if any."""
        return self._c.restored_step

    @property
    def start_step(self) -> int | None:
        """The step to tag this worker's first push of its sync and bounded
        tensors with, once initialize() or wait_for_init() returned: the step
        the chief started them at, the same on every worker (global_step()
        read later may have moved on). None before."""
        return self._c.start_step

    # pushes and pulls
    def push_async(self, items: Items, array: Any = None, *, step: int | None = None,
                   stream: Any = None) -> Future:
        """Pushes gradients: push_async(t, g), or push_async({t: g, ...}); step
        tags the push for sync and bounded tensors. stream (a torch.cuda.Stream,
        an object with __cuda_stream__, or a cudaStream_t as an int) orders the
        push on that CUDA stream: it reads the gradients once the stream's work
        before it is done, and the stream's later work waits for it."""
        return self._c.push_async(_pairs(items, array, "push"), step, stream)

    def push(self, items: Items, array: Any = None, *, step: int | None = None) -> None:
        self._c.push(_pairs(items, array, "push"), step)

    def pull_async(self, items: Items, out: Any = None, *, min_version: int = 1,
                   min_step: int = 0, stream: Any = None) -> Future:
        """Pulls into the caller's arrays: pull_async(t, out), or a dict; waits for
        min_version, or for sync/bounded tensors min_step (after pushing step t,
        min_step=t + 1). stream: as for push_async; the stream's later work
        sees the pulled weights."""
        return self._c.pull_async(_pairs(items, out, "pull"), min_version, min_step, stream)

    def pull(self, items: Items, out: Any = None, *, min_version: int = 1,
             min_step: int = 0) -> None:
        self._c.pull(_pairs(items, out, "pull"), min_version, min_step)

    def push_pull_async(self, items: Any, gradient: Any = None, weights: Any = None, *,
                        stream: Any = None) -> Future:
        """Pushes, then pulls the value with that push applied (async and bounded
        tensors): push_pull_async(t, g, w), or [(t, g, w), ...]; stream as for
        push_async."""
        if isinstance(items, Tensor):
            items = ((items, gradient, weights),)
        return self._c.push_pull_async(items, stream)

    def push_pull(self, items: Any, gradient: Any = None, weights: Any = None) -> None:
        if isinstance(items, Tensor):
            items = ((items, gradient, weights),)
        self._c.push_pull(items)

    # the coordinator
    def set_hyperparams(self, tensor: Tensor, **hyper: Any) -> None:
        """Chief only: new hyper-parameters from the next update on."""
        self._c.set_hyperparams(tensor, hyperparams(**hyper))

    def global_step(self) -> int:
        return self._c.global_step()

    # optimizer state (a trainer's state_dict)
    def optimizer_state(self, tensor: Tensor, slot: int) -> tuple[Any, int]:
        """The optimizer state the shards keep for `tensor`, one slot (0:
        Adam's first moment, the momentum buffer, Adagrad's sum; 1: Adam's
        second moment; 2: an f16/bf16 tensor's f32 master copy), as a new
        array of the tensor's shape (f64 for an f64 tensor, else f32), and the
        optimizer steps applied (Adam's t). A slot the rule keeps not is
        refused, naming it."""
        import numpy as np
        data, updates = self._c._optimizer_state(tensor, slot)
        wide = slot != 2 and self._c.info(tensor).dtype == DType.F64
        array = np.frombuffer(data, dtype=np.float64 if wide else np.float32).copy()
        return array.reshape(tensor.shape), updates

    def set_optimizer_state(self, tensor: Tensor, slot: int, values: Any, updates: int) -> None:
        """Chief only: sets that slot on the shards (what optimizer_state
        gives: the tensor's shape, f64 for an f64 tensor, else f32) and the
        steps applied. Between steps."""
        import numpy as np
        wide = slot != 2 and self._c.info(tensor).dtype == DType.F64
        want = np.float64 if wide else np.float32
        array = np.asarray(values)
        if tuple(array.shape) != tuple(tensor.shape) or array.dtype != want:
            raise _invalid(f"optimizer state of '{tensor.name}': an array of shape "
                           f"{tuple(array.shape)} and {array.dtype}, not {tuple(tensor.shape)} "
                           f"and {np.dtype(want)}")
        self._c._set_optimizer_state(tensor, slot, np.ascontiguousarray(array).tobytes(), updates)

    def save_checkpoint(self, timeout: float = 300.0) -> tuple[int, str]:
        """A checkpoint now, complete on disk: (global step, its directory)."""
        return self._c.save_checkpoint(timeout)

    def counters(self) -> Counters:
        return self._c.counters()

    @property
    def num_shards(self) -> int:
        return self._c.num_shards


# --- asyncio -----------------------------------------------------------------


async def _await_future(future: Future) -> Any:
    if not future.ready:
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        try:
            woken = loop.create_future()
            loop.add_reader(read_fd, lambda: woken.done() or woken.set_result(None))
            try:
                # The client writes a byte to its own duplicate of write_fd
                # once complete: no GIL on its progress thread.
                future._notify_fd(write_fd)
                await woken
            finally:
                loop.remove_reader(read_fd)
        finally:
            os.close(read_fd)
            os.close(write_fd)
    return future.result()
