"""tessera.spark: a Tessera cluster on Spark executors, as TensorFlowOnSpark
started TensorFlow's ps and worker tasks there.

    import tessera.spark

    def main_fn(args, ctx):          # on each worker, with its TF_CONFIG set
        client = tessera.Client.from_env()
        ...

    cluster = tessera.spark.run(sc, main_fn, args, num_ps=1, num_workers=2,
                                input_mode=tessera.spark.InputMode.TENSORFLOW)
    cluster.shutdown()

The tasks run as one barrier stage of num_ps + num_workers tasks, all at
once: each learns every task's address from the others (allGather), the
first num_ps serve as ps tasks (a tessera.Server in the task, which ends
once the workers are done) and the rest run main_fn(args, ctx) with their
TF_CONFIG. The secret goes to the executors as a file Spark distributes
(SparkContext.addFile), never in a closure or on a command line.

Input modes, as TensorFlowOnSpark's:
- InputMode.TENSORFLOW: the workers read their own data.
- InputMode.SPARK: cluster.train(rdd, num_epochs) feeds the RDD's
  partitions to the workers (ctx.get_data_feed().next_batch(n)), and
  cluster.inference(rdd) returns an RDD of what they compute for each
  record (feed.batch_results(results)). A worker with its own stopping
  rule calls feed.terminate(): the partitions still fed to it are answered
  without records, and train() ends.

eval_node=True adds TensorFlow's evaluator: one more task running main_fn,
outside the cluster (a read-only client), whose result shutdown() leaves in
cluster.evaluator_result. Then every task waits at a barrier once done, so
that the ps tasks serve until the evaluator, which reads after the workers
left, is done too.

A task that fails fails the stage with its error, which shutdown() (or
train and inference) raises, with Spark's own reason. A driver that dies
takes the cluster with it: each task holds a connection to the driver for
as long as it runs, and ends when that connection does (the driver's
process ended, or TCP keepalive found its host gone), so that nothing is
left serving or holding a port.

Task slots: the barrier stage holds num_ps + num_workers slots for the whole
run, so InputMode.SPARK, whose feeding tasks need slots of their own, needs
at least one more. run() waits up to reservation_timeout for that many and
otherwise fails, naming what it needs and what Spark offers, instead of
leaving train() waiting forever for a slot the stage holds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import socket
import tempfile
import re
import sys
import threading
import time
import traceback
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client as _Connect
from multiprocessing.connection import Listener
from typing import Any, Callable, Iterable

__all__ = ["InputMode", "TaskContext", "DataFeed", "TesseraCluster", "run"]



# A JVM exception's line ("org.apache.spark.scheduler.BarrierJobSlotsNumberCheckFailed:
# [SPARK-24819]: Barrier execution mode does not allow ..."): Spark's reason.
_JAVA_EXCEPTION = re.compile(r"^\s*(:\s*)?(Caused by: )?[a-z][\w$]*(\.[\w$]+)+: ")


class InputMode:
    TENSORFLOW = 0
    SPARK = 1


def _feed_key(secret: str) -> bytes:
    """What the data feeds authenticate with (multiprocessing's challenge,
    before anything is unpickled): derived from the secret, never it."""
    return hmac.new(secret.encode(), b"tessera spark feed v1", hashlib.sha256).digest()


# Ends a partition in a worker's queue (or, from None, the whole feeding).
_END = object()


class DataFeed:
    """A worker's share of the RDDs the driver feeds (InputMode.SPARK).

    next_batch(n) returns up to n records (fewer at the end of a partition,
    or once the feeding ended); should_stop() says that no more will come;
    in inference, batch_results(results) answers the records of the last
    batch, in their order. A partition's task on Spark ends once its records
    were all handed out (training) or answered (inference). terminate()
    ends this worker's feeding early (its own stopping rule, max_steps).
    """

    def __init__(self, key: bytes, host: str, qsize: int = 1024,
                 feed_timeout: float | None = None):
        self._input_tensors = None  # get_data_feed(input_mapping=...)
        # Bounded: a feeder waits while the worker is behind (back pressure).
        self._records: queue.Queue = queue.Queue(maxsize=qsize)
        # How long a feeder may wait for this worker to take a record.
        self._feed_timeout = feed_timeout
        self._listener = Listener((host, 0), authkey=key)
        self.address = self._listener.address
        self._stopped = threading.Event()
        self._terminated = threading.Event()  # terminate(): records are dropped
        self._ended_by_driver = threading.Event()  # shutdown() ended the feeding
        self._closed = threading.Event()  # the task is done: no more connections
        self._lock = threading.Lock()
        self._partitions: dict = {}  # connection id -> _Partition
        self._unanswered: list = []  # inference: the partition of each record handed out
        threading.Thread(target=self._accept, daemon=True).start()

    class _Partition:
        def __init__(self, conn, inference):
            self.conn, self.inference = conn, inference
            self.received = self.handed = 0
            self.results: list = []
            self.ended = False

    def _accept(self):
        _accept_until(self._listener, self._closed, lambda conn: threading.Thread(
            target=self._serve, args=(conn,), daemon=True).start())

    def _serve(self, conn):
        try:
            kind, inference = conn.recv()
            if kind == "terminate":  # the driver's shutdown(): no more partitions
                self._stopped.set()
                self._ended_by_driver.set()
                try:  # wakes a next_batch waiting on an empty queue
                    self._records.put_nowait((None, _END))
                except queue.Full:
                    pass  # none waits: next_batch sees the stop once it emptied it
                conn.send(("ok", None))
                return
            part = self._Partition(conn, inference)
            with self._lock:
                self._partitions[id(conn)] = part
            while True:
                kind, payload = conn.recv()
                if kind == "records":
                    with self._lock:
                        part.received += len(payload)
                    for r in payload:
                        try:
                            self._put((id(conn), r))
                        except queue.Full:
                            # The worker stopped reading: the feeder is told
                            # why, rather than waiting forever; the rest it
                            # sends is drained (unread bytes at close would
                            # reset the connection and lose that answer).
                            conn.send(("stalled", self._feed_timeout))
                            while True:
                                conn.recv()
                elif kind == "end":
                    with self._lock:
                        part.ended = True
                    if self._terminated.is_set():
                        return self._answer_terminated(id(conn))
                    self._put((id(conn), _END))
                    return
        except (EOFError, OSError):
            return

    def _put(self, item) -> None:
        """Queues a record for next_batch, waiting while the queue is full
        (back pressure) for up to feed_timeout (then queue.Full); drops it
        once this worker terminated."""
        deadline = None if self._feed_timeout is None else time.monotonic() + self._feed_timeout
        while not self._terminated.is_set():
            wait = 0.1 if deadline is None else min(0.1, max(0.0, deadline - time.monotonic()))
            try:
                return self._records.put(item, timeout=wait)
            except queue.Full:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    def terminate(self) -> None:
        """TensorFlowOnSpark's terminate(): this worker takes no more
        records. What is queued is dropped, and every partition fed to it
        from now on is answered, once its feeder sent it, without records
        taken (inference: without results), so that train() and inference()
        end instead of waiting for this worker. Call it before main_fn
        returns early (at its own max_steps): its task then stays to answer
        the feeders until shutdown(). should_stop() is true from now on."""
        self._terminated.set()
        self._stopped.set()
        while True:  # what waits in the queue goes, and a blocked put goes on
            try:
                self._records.get_nowait()
            except queue.Empty:
                break
        with self._lock:
            ended = [cid for cid, part in self._partitions.items() if part.ended]
        for cid in ended:
            self._answer_terminated(cid)

    def _answer_terminated(self, cid) -> None:
        with self._lock:
            part = self._partitions.pop(cid, None)
        if part is None:
            return  # answered already
        try:
            part.conn.send(("terminated", None))
            part.conn.close()
        except OSError:
            pass  # the feeder is gone: its task says why

    def next_batch(self, n: int) -> list | dict:
        """Up to n records; with get_data_feed(input_mapping=...), a dict of
        each mapped name's column instead, as TensorFlowOnSpark's."""
        batch = self._next_records(n)
        if self._input_tensors is None:
            return batch
        columns = {name: [] for name in self._input_tensors}
        for record in batch:
            for i, name in enumerate(self._input_tensors):
                columns[name].append(record[i])
        return columns

    def _next_records(self, n: int) -> list:
        batch = []
        while len(batch) < n and not (self._stopped.is_set() and self._records.empty()):
            if self._terminated.is_set():
                return []
            cid, r = self._records.get()
            if r is _END:
                if cid is not None:
                    self._maybe_answer(cid)
                if batch:
                    break
                continue
            with self._lock:
                part = self._partitions[cid]
                part.handed += 1
                if part.inference:
                    self._unanswered.append(cid)
            batch.append(r)
        return batch

    def batch_results(self, results: Iterable) -> None:
        for r in results:
            with self._lock:
                cid = self._unanswered.pop(0)
                self._partitions[cid].results.append(r)
            self._maybe_answer(cid)

    def _maybe_answer(self, cid):
        """Ends a partition's task once all its records were handed out
        (training) or answered (inference)."""
        with self._lock:
            part = self._partitions.get(cid)
            if part is None or not part.ended or part.handed < part.received:
                return
            if part.inference and len(part.results) < part.received:
                return
            del self._partitions[cid]
        part.conn.send(("done", part.results))
        part.conn.close()

    def should_stop(self) -> bool:
        return self._terminated.is_set() or (self._stopped.is_set() and self._records.empty())

    def _serve_until_shutdown(self) -> None:
        """After main_fn returned having terminated: the feeders still get
        their answers until the driver's shutdown() ends the feeding."""
        self._ended_by_driver.wait()

    def _close(self) -> None:
        self._stopped.set()
        self._closed.set()
        _wake_and_close(self._listener)


class _DriverLiveness:
    """The driver's end of the tasks' liveness connections: a listener each
    task connects to and holds while it runs. When the driver's process
    dies the kernel closes them, which every task sees (_watch_driver);
    when the stage ends while tasks still run (a task failed), close() tells
    them so first."""

    def __init__(self, host: str, key: bytes):
        self._listener = Listener((host, 0), authkey=key)
        self.address = self._listener.address
        self._held: list = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        _accept_until(self._listener, self._closed, self._held.append)

    def close(self):
        self._closed.set()
        _wake_and_close(self._listener)
        for conn in self._held:
            try:
                conn.send_bytes(b"the cluster's stage ended (a task failed, or it was cancelled)")
            except OSError:
                pass  # that task is gone already
            conn.close()


def _wake_and_close(listener: Listener) -> None:
    """Closes a listener whose accept loop (_accept_until) has been told to
    stop: closing its socket does not wake an accept() blocked on it (Linux),
    a connection does, and the loop then sees its stop."""
    try:
        socket.create_connection(listener.address, timeout=1).close()
    except OSError:
        pass  # nothing listens any more
    listener.close()


def _accept_until(listener: Listener, stop: threading.Event,
                  take: Callable[[Any], None]) -> None:
    """Hands each authenticated connection to take() until `stop` is set.
    A peer without the key, or one gone during the handshake, is dropped
    and the next one accepted at once; any other error (the listener
    closed, too many open files) waits 0.1 s before the next try, so that
    an error that persists never spins a core."""
    while not stop.is_set():
        try:
            conn = listener.accept()
        except (AuthenticationError, EOFError, ConnectionError):
            continue
        except Exception:  # noqa: BLE001 - whatever it is, it is retried slowly
            stop.wait(0.1)
            continue
        take(conn)


def _watch_driver(address, key: bytes, on_gone: Callable[[str], None]) -> Callable[[], None]:
    """A task's end of its liveness connection to the driver: on_gone(why)
    runs (on a thread of its own) once the driver is gone or ended the
    stage. Returns what ends the watch, for when the task itself is done."""
    conn = _Connect(tuple(address), authkey=key)
    # A driver host that dies without closing the connection: keepalive
    # probes find it within about 25 s.
    with socket.socket(fileno=os.dup(conn.fileno())) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    done = threading.Event()

    def watch():
        try:
            # The driver writes only when the stage ended: a short line, read
            # as bytes (nothing unpickled) and bounded.
            why = conn.recv_bytes(maxlength=256).decode(errors="replace")
        except (EOFError, OSError):
            why = "the driver is gone (its connection closed)"
        if not done.is_set():
            on_gone(why)

    threading.Thread(target=watch, daemon=True).start()

    def stop():
        done.set()
        # Wakes the watch's recv (a close alone would not), then lets go.
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        conn.close()

    return stop


def _driver_gone(job: str, index: int, why: str) -> None:
    """A task whose driver died, or whose stage ended without it, ends at
    once, and with it its server or main_fn: nobody is left to collect it,
    and its ports must come free."""
    print(f"tessera.spark: /job:{job}/task:{index}: {why}; this task ends", file=sys.stderr,
          flush=True)
    os._exit(1)


class TaskContext:
    """What main_fn gets: its task in the cluster and, in InputMode.SPARK,
    its data feed."""

    def __init__(self, job_name, task_index, cluster_spec, feed, worker_num):
        self.job_name = job_name
        self.task_index = task_index
        self.cluster_spec = cluster_spec
        self.num_workers = len(cluster_spec["worker"])
        # TensorFlowOnSpark's numbering of the cluster's tasks, ps tasks
        # first: this task's place in the barrier stage.
        self.worker_num = worker_num
        self.executor_id = worker_num
        self._feed = feed

    def absolute_path(self, path: str) -> str:
        """TensorFlowOnSpark's: a path with a scheme (hdfs://, s3a://) as it
        is, a local one made absolute against the task's working directory."""
        return path if "://" in path else os.path.abspath(path)

    def get_data_feed(self, train_mode: bool = True, qname_in: str = "input",
                      qname_out: str = "output", input_mapping: dict | None = None) -> DataFeed:
        """This worker's data feed (InputMode.SPARK), as TensorFlowOnSpark's
        get_data_feed. input_mapping ({column: name}) makes next_batch return
        {name: [values]}, a record's columns taken in the order of the
        sorted column names. train_mode needs no setting: each partition
        says whether it is training's or inference's. There is one feed per
        worker, so the queue names can only be TensorFlowOnSpark's defaults."""
        if self._feed is None:
            raise RuntimeError("this cluster runs with InputMode.TENSORFLOW: no data feed")
        if (qname_in, qname_out) != ("input", "output"):
            raise ValueError(f"get_data_feed: qname_in={qname_in!r}, qname_out={qname_out!r}: "
                             "tessera.spark has one feed per worker, named 'input' and 'output'")
        del train_mode  # each partition says which it is
        if input_mapping is not None:
            self._feed._input_tensors = [name for _, name in sorted(input_mapping.items())]
        return self._feed


def _barrier_task(num_ps, num_workers, eval_node, main_fn, args, input_mode, registry,
                  liveness, transport, checkpoint_dir, secret_name, feed_timeout):
    """One task of the barrier stage (on an executor)."""

    def run_task(_):
        from pyspark import BarrierTaskContext, SparkFiles

        ctx = BarrierTaskContext.get()
        me = ctx.partitionId()
        host = ctx.getTaskInfos()[me].address.rsplit(":", 1)[0]
        # A port for this task's server, held until it serves.
        held = socket.socket()
        held.bind((host, 0))
        port = held.getsockname()[1]
        everyone = ctx.allGather(f"{host}:{port}")
        # An evaluator (eval_node) is the last task, outside the cluster as
        # TensorFlow's is: a read-only client (ClientOptions::FromEnv).
        cluster = {"ps": everyone[:num_ps], "worker": everyone[num_ps:num_ps + num_workers]}
        secret_file = SparkFiles.get(secret_name)
        with open(secret_file) as f:
            secret = f.read().strip()
        job, index = (("ps", me) if me < num_ps else
                      ("worker", me - num_ps) if me < num_ps + num_workers else ("evaluator", 0))
        stop_watching = _watch_driver(liveness, _feed_key(secret),
                                      lambda why: _driver_gone(job, index, why))
        try:
            # With an evaluator, every task meets at a barrier once done, so
            # that the ps tasks serve until the evaluator, which reads after
            # the workers left, is done too.
            all_done = ctx.barrier if eval_node else (lambda: None)
            yield from serve(job, index, me, host, cluster, secret, secret_file, held, all_done)
        finally:
            stop_watching()

    def serve(job, index, worker_num, host, cluster, secret, secret_file, held, all_done):
        from . import _tessera

        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                              "task": {"type": job, "index": index}})
        os.environ["TESSERA_SECRET_FILE"] = secret_file
        os.environ.pop("TESSERA_SECRET", None)
        os.environ["TESSERA_TRANSPORT"] = transport
        held.close()
        if job == "ps":
            # A barrier task is never restarted alone (Spark restarts the
            # whole stage): a worker that left is not waited for.
            server = _tessera.Server(json.dumps(cluster), "ps", index, secret, transport,
                                     checkpoint_dir or "", True, host, worker_rejoin_s=0.0)
            try:
                # First: a ps task that is not the coordinator may only learn
                # that the workers are done once ps task 0 stopped.
                all_done()
                server.wait_until_workers_leave()
            finally:
                server.stop()
            yield ("ps", index, None)
            return
        feed = None
        if input_mode == InputMode.SPARK and job == "worker":
            feed = DataFeed(_feed_key(secret), host, feed_timeout=feed_timeout)
            with _Connect(registry, authkey=_feed_key(secret)) as c:
                c.send(("worker", index, feed.address))
        result = main_fn(args, TaskContext(job, index, cluster, feed, worker_num))
        if feed is not None:
            if feed._terminated.is_set():
                feed._serve_until_shutdown()
            feed._close()
        all_done()
        yield (job, index, result)

    return run_task


class TesseraCluster:
    """The running cluster, as TFCluster was: train, inference, shutdown."""

    def __init__(self, sc, num_ps, num_workers, input_mode, key):
        self.sc, self.num_ps, self.num_workers = sc, num_ps, num_workers
        self.input_mode, self._key = input_mode, key
        self.feeds: list = [None] * num_workers  # each worker's feed address
        self.results = None  # each worker's main_fn result, once shut down
        self.evaluator_result = None  # the evaluator's (eval_node), once shut down
        self._thread = None
        self._error = None
        self._outcome = None
        self.feed_timeout: float | None = None

    def _raise_if_failed(self):
        if self._error is not None:
            raise RuntimeError(f"the Tessera cluster's Spark stage failed: {self._error}")

    def train(self, rdd, num_epochs: int = 1, feed_timeout: float | None = None,
              qname: str = "input") -> None:
        """Feeds every partition of rdd to a worker, num_epochs times. A
        worker that takes no record for feed_timeout seconds (run()'s when
        None) fails it. qname: TensorFlowOnSpark's; one feed per worker, so
        only "input"."""
        self._need_spark_mode("train")
        _one_queue(qname)
        feeds, key = list(self.feeds), self._key
        timeout = self.feed_timeout if feed_timeout is None else feed_timeout
        for _ in range(num_epochs):
            self._raise_if_failed()
            self._feeding(lambda: rdd.mapPartitionsWithIndex(
                _feeder(feeds, key, False, timeout)).count())

    def inference(self, rdd, feed_timeout: float | None = None, qname: str = "input"):
        """An RDD of what the workers answer for each record of rdd
        (feed_timeout and qname as in train)."""
        self._need_spark_mode("inference")
        _one_queue(qname)
        self._raise_if_failed()
        timeout = self.feed_timeout if feed_timeout is None else feed_timeout
        return rdd.mapPartitionsWithIndex(_feeder(list(self.feeds), self._key, True, timeout))

    def _feeding(self, job):
        """Runs a feeding job; when it fails because a worker died, the
        cluster's stage says why: that error is raised instead."""
        try:
            return job()
        except Exception as e:
            said = _task_error(e)
            if "stopped reading its data feed" not in said:  # a task may have failed
                self._thread.join(60)  # the stage ends once a task failed
            self._raise_if_failed()
            raise RuntimeError(f"feeding the Tessera cluster failed: {said}") from e

    def shutdown(self, timeout: float | None = None) -> list:
        """Ends the feeds (InputMode.SPARK), waits for main_fn on every
        worker to return and for the ps tasks to stop (the coordinator with a
        final checkpoint), and returns each worker's main_fn result; raises
        the failed task's error."""
        if self.input_mode == InputMode.SPARK:
            for address in self.feeds:
                try:
                    with _Connect(tuple(address), authkey=self._key) as c:
                        c.send(("terminate", None))
                        c.recv()
                except (OSError, EOFError):
                    pass  # a worker already gone: the stage's outcome says why
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the Tessera cluster did not stop within {timeout} s")
        self._raise_if_failed()
        workers = sorted((i, r) for kind, i, r in self._outcome if kind == "worker")
        self.results = [r for _, r in workers]
        self.evaluator_result = next(
            (r for kind, _, r in self._outcome if kind == "evaluator"), None)
        return self.results

    def _need_spark_mode(self, what):
        if self.input_mode != InputMode.SPARK:
            raise RuntimeError(f"{what} needs InputMode.SPARK; with InputMode.TENSORFLOW the "
                               "workers read their own data")


def _one_queue(qname: str) -> None:
    if qname != "input":
        raise ValueError(f"qname={qname!r}: tessera.spark has one feed per worker, named 'input'")


def _feeder(feeds, key, inference, feed_timeout):
    def feed(i, records):
        worker = i % len(feeds)

        def stalled():
            return RuntimeError(
                f"worker {worker} did not take (or answer) the records of partition {i} "
                f"within {feed_timeout} s (feed_timeout): it stopped reading its data feed")
        with _Connect(tuple(feeds[worker]), authkey=key) as c:
            try:
                c.send(("partition", inference))
                chunk = []
                for r in records:
                    chunk.append(r)
                    if len(chunk) == 256:
                        c.send(("records", chunk))
                        chunk = []
                if chunk:
                    c.send(("records", chunk))
                c.send(("end", None))
            except OSError:  # the worker closed the feed: it says why below
                pass
            # The rest of the partition taken (and, in inference, answered)
            # within feed_timeout.
            if feed_timeout is not None and not c.poll(feed_timeout):
                raise stalled()
            try:
                kind, results = c.recv()
            except (EOFError, OSError):
                raise RuntimeError(f"worker {worker} closed its data feed before it took "
                                   f"partition {i} (it ended)") from None
            if kind == "stalled":
                raise stalled()
            if kind == "terminated":  # the worker ended its feeding (DataFeed.terminate)
                return iter([])
        return iter(results if inference else [])
    return feed


def run(sc, main_fn: Callable[[Any, TaskContext], Any], args: Any, num_ps: int,
        num_workers: int, input_mode: int = InputMode.TENSORFLOW, *, transport: str = "tcp",
        checkpoint_dir: str | None = None, feed_timeout: float = 600,
        reservation_timeout: float = 600, eval_node: bool = False) -> TesseraCluster:
    """Starts num_ps ps tasks and num_workers workers running main_fn as one
    barrier stage. Spark needs num_ps + num_workers task slots at once, one
    more in InputMode.SPARK (for the feeding tasks): run() waits up to
    reservation_timeout seconds for them, then fails naming both numbers.
    feed_timeout: how long a worker may take no record before train() or
    inference() fails, naming it. eval_node: one more task, TensorFlow's
    evaluator (ctx.job_name "evaluator", outside the cluster, a read-only
    client), runs main_fn too (and needs a slot); it gets no data feed, must
    return by itself, and shutdown() leaves its result in
    cluster.evaluator_result."""
    if num_ps < 1 or num_workers < 1:
        raise ValueError("a Tessera cluster needs at least one ps task and one worker")
    _reserve_slots(sc, num_ps, num_workers, input_mode, reservation_timeout, eval_node)
    secret = os.urandom(32).hex()
    secret_dir = tempfile.mkdtemp(prefix="tessera-spark-")
    # Each cluster its own file: Spark refuses the same name with other bytes.
    secret_name = f"tessera-secret-{os.urandom(8).hex()}"
    secret_path = os.path.join(secret_dir, secret_name)
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    sc.addFile(secret_path)
    key = _feed_key(secret)
    cluster = TesseraCluster(sc, num_ps, num_workers, input_mode, key)
    cluster.feed_timeout = feed_timeout
    registry = None
    if input_mode == InputMode.SPARK:
        driver = sc.getConf().get("spark.driver.host", socket.gethostname())
        registry = Listener((driver, 0), authkey=key)
    n = num_ps + num_workers + (1 if eval_node else 0)
    liveness = _DriverLiveness(sc.getConf().get("spark.driver.host", socket.gethostname()), key)
    task = _barrier_task(num_ps, num_workers, eval_node, main_fn, args, input_mode,
                         registry.address if registry else None, liveness.address, transport,
                         checkpoint_dir, secret_name, feed_timeout)

    def stage():
        try:
            cluster._outcome = sc.parallelize(range(n), n).barrier().mapPartitions(task).collect()
        except Exception as e:  # the failed task's error, as Spark reports it
            cluster._error = _task_error(e)
        finally:
            liveness.close()
            if registry is not None:
                registry.close()

    cluster._thread = threading.Thread(target=stage, daemon=True)
    cluster._thread.start()
    if registry is not None:
        # Each worker says where its feed is; the stage's failure ends the wait.
        waiting = threading.Event()

        def collect():
            try:
                for _ in range(num_workers):
                    with registry.accept() as c:
                        _, index, address = c.recv()
                        cluster.feeds[index] = address
            except OSError:
                pass
            waiting.set()
        threading.Thread(target=collect, daemon=True).start()
        while not waiting.wait(0.2):
            if not cluster._thread.is_alive() or cluster._error is not None:
                break
        cluster._raise_if_failed()
        if any(f is None for f in cluster.feeds):
            raise RuntimeError("not every worker reported its data feed")
    return cluster


def _slots(sc) -> int:
    """The tasks Spark can run at once now: what its barrier scheduling
    checks (SparkContext.maxNumConcurrentTasks), else defaultParallelism."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # another Spark's private API: its usual figure
        return int(sc.defaultParallelism)


def _reserve_slots(sc, num_ps, num_workers, input_mode, timeout, eval_node=False):
    """Waits (executors register as they start) until Spark has the slots
    the cluster needs, or fails naming what it needs and what it has."""
    needed = (num_ps + num_workers + (1 if eval_node else 0) +
              (1 if input_mode == InputMode.SPARK else 0))
    deadline = time.monotonic() + timeout
    have = _slots(sc)
    while have < needed and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))  # executors still starting
        have = _slots(sc)
    if have < needed:
        why = (f"{num_ps} ps + {num_workers} workers" + (" + 1 evaluator" if eval_node else "") +
               " in one barrier stage"
               + (", and 1 for the feeding tasks of InputMode.SPARK"
                  if input_mode == InputMode.SPARK else ""))
        raise RuntimeError(
            f"the Tessera cluster needs {needed} Spark task slots at once ({why}); Spark "
            f"offers {have} (waited {timeout:g} s, reservation_timeout): add executors or cores, "
            "or ask for fewer tasks")


def _task_error(e: Exception) -> str:
    """What Spark says about a failed task, without the JVM's stack: the
    task's own Python error where there is one, why the stage failed, and a
    Python worker's crash."""
    lines = [ln for ln in str(e).splitlines()
             if ln.strip() and not ln.lstrip().startswith("at ")]
    said = []
    for i, ln in enumerate(lines):
        if "Traceback (most recent call last)" in ln:
            frames = []
            for x in lines[i + 1:]:
                if "Exception" in x and x.startswith("org."):
                    break
                frames.append(x)
            said.append("\n".join(frames[-3:]))
            break
    for ln in lines:
        if "Job aborted due to stage failure:" in ln:
            said.append(ln.split("Job aborted due to stage failure:", 1)[1].strip())
        elif "exited unexpectedly" in ln or "crashed" in ln:
            said.append(ln.strip())
        elif _JAVA_EXCEPTION.match(ln) and "Traceback" not in ln and "py4j." not in ln:
            said.append(ln.strip().lstrip(": "))  # Spark's own reason (barrier slots, ...)
    if said:
        return "\n".join(dict.fromkeys(said))  # each once, in order
    return lines[0] if lines else traceback.format_exception_only(type(e), e)[-1].strip()
