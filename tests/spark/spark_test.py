"""tessera.spark on a real Spark (PyPI's pyspark, Debian's Java) in local
mode: the PyTorch digits example (examples/torch_digits.py) trained by 2
ps tasks and 2 workers as one barrier stage, to the accuracy it reaches
under tessera launch; the same data fed by Spark (InputMode.SPARK) through
cluster.train and answered by cluster.inference; a failing task, whose
error fails the stage and reaches the driver; and a killed driver, whose
tasks must end with it. Run by run.sh."""

import os
import time
import sys

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install pyspark)")
from pyspark.sql import SparkSession  # noqa: E402

import tessera  # noqa: E402
import tessera.spark  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


# Every test that takes `sc` runs on both: local mode (executor threads in
# the driver's JVM) and a local cluster (a master, and two executor JVMs of
# two cores each, as on a real cluster), four task slots each.
MASTERS = ["local[4]", "local-cluster[2,2,1024]"]


@pytest.fixture(scope="module", params=MASTERS)
def sc(request):
    # The executors' Python workers: this interpreter, this package.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # The workers unpickle the main functions below by reference: this
    # file's module, and the example's.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.abspath(EXAMPLES), os.path.dirname(os.path.abspath(__file__))] +
        os.environ.get("PYTHONPATH", "").split(os.pathsep))
    spark = (SparkSession.builder.master(request.param).appName("tessera-spark-test")
             .config("spark.ui.enabled", "false")
             .config("spark.task.maxFailures", "1")  # a failed task fails the test, once
             # A local cluster's executors are processes of their own: they
             # get the Python and the path here, as a real cluster's would.
             .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
             .config("spark.pyspark.python", sys.executable)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    yield spark.sparkContext
    spark.stop()


def digits_main(args, ctx):
    """Each worker: the example's own training (TF_CONFIG is set)."""
    import torch_digits
    return torch_digits.train(args)


def test_digits_example_through_spark(sc, tmp_path):
    cluster = tessera.spark.run(sc, digits_main, ["--steps", "300"], num_ps=2, num_workers=2,
                                input_mode=tessera.spark.InputMode.TENSORFLOW,
                                checkpoint_dir=str(tmp_path / "ckpt"))
    results = cluster.shutdown(timeout=600)
    accuracy = results[0]  # the chief's
    print(f"held-out accuracy {accuracy:.4f} through Spark")
    assert accuracy >= 0.95
    assert results[1] is None
    # shutdown() stopped the coordinator with a final checkpoint.
    assert any(p.name.startswith("step-") for p in (tmp_path / "ckpt").iterdir())


def test_an_evaluator_node_reads_what_the_workers_train(sc):
    # eval_node: TensorFlowOnSpark's evaluator, one more task running the
    # same main_fn; the digits example evaluates there (a read-only client)
    # as the global step moves, and ends at the last step's weights.
    cluster = tessera.spark.run(sc, digits_main, ["--steps", "200"], num_ps=1, num_workers=2,
                                input_mode=tessera.spark.InputMode.TENSORFLOW, eval_node=True)
    results = cluster.shutdown(timeout=600)
    assert len(results) == 2 and results[1] is None  # the workers' only
    print(f"chief {results[0]:.4f}, evaluator {cluster.evaluator_result:.4f}")
    assert cluster.evaluator_result == results[0]


def terminating_main(args, ctx):
    """Worker 0 ends its feeding after `args` records (its own max_steps);
    worker 1 reads everything it is fed."""
    with tessera.Client.from_env():  # the ps task waits for its workers
        feed = ctx.get_data_feed()
        taken = 0
        while not feed.should_stop():
            taken += len(feed.next_batch(50))
            if ctx.task_index == 0 and taken >= args:
                feed.terminate()
                assert feed.should_stop() and feed.next_batch(50) == []
    return taken


def test_a_worker_that_terminates_its_feed_ends_it_early(sc):
    cluster = tessera.spark.run(sc, terminating_main, 200, num_ps=1, num_workers=2,
                                input_mode=tessera.spark.InputMode.SPARK, feed_timeout=60)
    # Partition i goes to worker i % 2: 4 each, 1000 records each.
    records = sc.parallelize(range(8000), 8)
    started = time.monotonic()
    with pytest.raises(ValueError, match="qname='errors'"):
        cluster.train(records, qname="errors")
    cluster.train(records, num_epochs=2, feed_timeout=60)  # the second: worker 0 takes none
    took = time.monotonic() - started
    results = cluster.shutdown(timeout=120)
    print(f"train() took {took:.1f} s; the workers took {results}")
    assert 200 <= results[0] < 4000, results
    assert results[1] == 2 * 4000, results


def fed_main(args, ctx):
    """Each worker: an MLP trained on what Spark feeds it, async Adam on the
    shards; then it answers inference records with its predictions. Its
    feed is asked for as TensorFlowOnSpark's (get_data_feed's arguments),
    its batches come as columns (input_mapping)."""
    import torch

    import tessera.torch
    torch.set_num_threads(1)
    client = tessera.Client.from_env()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = tessera.torch.DistributedOptimizer(client, model, "adam", mode="async", lr=0.01,
                                             prefix="fed/")
    try:
        ctx.get_data_feed(qname_in="images")
        refused = None
    except ValueError as e:
        refused = str(e)
    # A record is (pixels, label): its columns in the order of their names.
    feed = ctx.get_data_feed(train_mode=True, input_mapping={"1_label": "y", "0_pixels": "x"})
    loss_fn = torch.nn.CrossEntropyLoss()
    trained = 0
    while not feed.should_stop():
        batch = feed.next_batch(32)
        if not batch["x"]:
            continue
        x = torch.tensor(np.array(batch["x"]), dtype=torch.float32)
        if batch["y"][0] < 0:  # inference records carry no label
            with torch.no_grad():
                feed.batch_results(model(x).argmax(1).tolist())
            continue
        y = torch.tensor(batch["y"], dtype=torch.int64)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        trained += len(batch["y"])
    client.close()
    return {"trained": trained, "worker_num": ctx.worker_num, "executor_id": ctx.executor_id,
            "refused": refused, "paths": (ctx.absolute_path("model.pt"),
                                          ctx.absolute_path("hdfs://nn/model.pt"))}


def test_spark_feeds_training_and_inference(sc):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        d.data / 16.0, d.target, test_size=0.2, random_state=0, stratify=d.target)
    cluster = tessera.spark.run(sc, fed_main, None, num_ps=1, num_workers=2,
                                input_mode=tessera.spark.InputMode.SPARK)
    train = sc.parallelize([(x.tolist(), int(y)) for x, y in zip(x_train, y_train)], 4)
    cluster.train(train, num_epochs=8)
    test = sc.parallelize([(x.tolist(), -1) for x in x_test], 4)
    predictions = cluster.inference(test).collect()
    results = cluster.shutdown(timeout=300)
    assert sum(r["trained"] for r in results) == 8 * len(x_train), results
    # TensorFlowOnSpark's numbering: the ps task is 0, the workers 1 and 2.
    assert [(r["worker_num"], r["executor_id"]) for r in results] == [(1, 1), (2, 2)]
    assert "qname_in='images'" in results[0]["refused"], results[0]["refused"]
    local, uri = results[0]["paths"]
    assert os.path.isabs(local) and local.endswith("/model.pt") and uri == "hdfs://nn/model.pt"
    accuracy = float(np.mean(np.array(predictions) == y_test))
    print(f"inference accuracy {accuracy:.4f} over {len(predictions)} Spark records")
    assert len(predictions) == len(y_test)
    assert accuracy >= 0.9


def failing_main(args, ctx):
    client = tessera.Client.from_env()
    if ctx.task_index == 1:
        raise ValueError("worker 1 could not read its data (on purpose)")
    client.wait_for_init(60)
    return "never"


def test_a_failed_task_fails_the_stage_with_its_error(sc):
    cluster = tessera.spark.run(sc, failing_main, None, num_ps=1, num_workers=2)
    with pytest.raises(RuntimeError) as e:
        cluster.shutdown(timeout=300)
    assert "worker 1 could not read its data (on purpose)" in str(e.value)


def killed_main(args, ctx):
    """Sync training until this task is SIGKILLed; each worker says where it
    is (its pid, the cluster) in a file of the test's."""
    import json
    import time
    client = tessera.Client.from_env()
    t = client.declare("k", (8,), "f32", "add", mode=tessera.sync())
    client.initialize() if client.is_chief else client.wait_for_init()
    out = np.zeros(8, np.float32)
    step = 0
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        client.push(t, np.ones(8, np.float32), step=step)
        client.pull(t, out, min_step=step + 1)
        step += 1
        if step == 20:
            with open(os.path.join(args, f"worker{ctx.task_index}.json"), "w") as f:
                json.dump({"pid": os.getpid(), "cluster": ctx.cluster_spec}, f)
    return step


def test_a_killed_worker_fails_the_stage_and_leaves_nothing_serving(sc, tmp_path):
    import json
    import signal
    import socket
    import time
    cluster = tessera.spark.run(sc, killed_main, str(tmp_path), num_ps=1, num_workers=2)
    report = tmp_path / "worker1.json"
    deadline = time.monotonic() + 120
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the next look: training is under way once it is there
    assert report.exists(), "worker 1 never reached step 20"
    info = json.loads(report.read_text())
    killed = time.monotonic()
    os.kill(info["pid"], signal.SIGKILL)
    with pytest.raises(RuntimeError) as e:
        cluster.shutdown(timeout=300)
    print(f"the stage failed {time.monotonic() - killed:.1f} s after the kill: {e.value}")
    # Named by whichever task saw it first: the surviving worker (the killed
    # one disconnected), the ps task (it left without saying bye), or Spark
    # (its Python worker crashed).
    said = str(e.value)
    assert ("/job:worker/task:1 disconnected" in said or
            "/job:worker/task:1 left without saying bye" in said or
            "exited unexpectedly" in said or "crashed" in said), said
    # Nothing of the cluster is left serving: every task's port refuses.
    for address in info["cluster"]["ps"] + info["cluster"]["worker"]:
        host, port = address.rsplit(":", 1)
        with socket.socket() as s:
            s.settimeout(5)
            assert s.connect_ex((host, int(port))) != 0, f"{address} still accepts connections"


def test_too_few_slots_fail_at_run_naming_them(sc):
    # local[4]: four slots. InputMode.SPARK with 1 ps + 3 workers (the slots
    # TensorFlowOnSpark would size it with) used to hang in train(): the
    # feeding tasks waited for slots the barrier stage held.
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"needs 5 Spark task slots at once \(1 ps \+ 3 "
                       r"workers in one barrier stage, and 1 for the feeding tasks of "
                       r"InputMode.SPARK\); Spark offers 4 \(waited 1 s"):
        tessera.spark.run(sc, fed_main, None, num_ps=1, num_workers=3,
                          input_mode=tessera.spark.InputMode.SPARK, reservation_timeout=1)
    with pytest.raises(RuntimeError, match=r"needs 6 Spark task slots .*offers 4"):
        tessera.spark.run(sc, fed_main, None, num_ps=2, num_workers=4, reservation_timeout=1)
    with pytest.raises(RuntimeError, match=r"needs 5 Spark task slots at once \(1 ps \+ 3 "
                       r"workers \+ 1 evaluator in one barrier stage\); Spark offers 4"):
        tessera.spark.run(sc, fed_main, None, num_ps=1, num_workers=3, eval_node=True,
                          reservation_timeout=1)
    assert time.monotonic() - started < 60  # not Spark's own check, ten minutes on


def stalled_main(args, ctx):
    """A worker that stops reading its feed (it waits for the end instead)."""
    import time
    with tessera.Client.from_env():  # the ps task waits for its workers
        feed = ctx.get_data_feed()
        while not feed._stopped.is_set():
            time.sleep(0.05)
    return "stalled"


def test_feed_timeout_fails_train_naming_the_worker(sc):
    cluster = tessera.spark.run(sc, stalled_main, None, num_ps=1, num_workers=1,
                                input_mode=tessera.spark.InputMode.SPARK, feed_timeout=2)
    records = sc.parallelize(range(5000), 1)  # more than a feed's queue holds
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker 0 did not take .* within 2 s "
                       r"\(feed_timeout\)"):
        cluster.train(records)
    assert time.monotonic() - started < 120
    assert cluster.shutdown(timeout=120) == ["stalled"]


def test_sparks_own_reason_stays_in_the_error():
    # What py4j raises when Spark's barrier check fails the stage: the old
    # _task_error kept only the first line ("An error occurred while
    # calling ..."), which says nothing.
    text = ("An error occurred while calling o123.collectAndServe.\n"
            ": org.apache.spark.scheduler.BarrierJobSlotsNumberCheckFailed: [SPARK-24819]: "
            "Barrier execution mode does not allow run a barrier stage that requires more "
            "slots than the total number of slots in the cluster currently.\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.checkBarrierStageWithNumSlots("
            "DAGScheduler.scala:560)\n")
    said = tessera.spark._task_error(Exception(text))
    assert said.startswith("org.apache.spark.scheduler.BarrierJobSlotsNumberCheckFailed: "
                           "[SPARK-24819]: Barrier execution mode does not allow"), said


def test_a_killed_driver_leaves_no_task_serving(tmp_path):
    # The driver (its own process, started here) is SIGKILLed mid-training:
    # every task must end and free its port, instead of training on, or
    # serving, for nobody.
    import json
    import signal
    import socket
    import subprocess
    import time
    here = os.path.dirname(os.path.abspath(__file__))
    # A mark in its environment, which its JVM and Python workers inherit:
    # what is left of them is found by it, and killed, at the end.
    mark = f"TESSERA_KILLED_DRIVER_TEST={os.getpid()}-{time.monotonic_ns()}"
    # Its executors' Python workers: this interpreter, and this file's
    # module (killed_main) on their path.
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(
        [here] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    env[mark.split("=")[0]] = mark.split("=")[1]
    driver = subprocess.Popen([sys.executable, os.path.join(here, "killed_driver.py"),
                               str(tmp_path)], env=env, start_new_session=True)
    try:
        reports = [tmp_path / f"worker{i}.json" for i in (0, 1)]
        deadline = time.monotonic() + 180
        while not all(r.exists() for r in reports) and time.monotonic() < deadline:
            assert driver.poll() is None, f"the driver ended first (exit {driver.returncode})"
            time.sleep(0.05)  # the next look: training is under way once both are there
        assert all(r.exists() for r in reports), "the workers never reached step 20"

        def report(path):  # once written whole
            while True:
                try:
                    return json.loads(path.read_text())
                except ValueError:
                    assert time.monotonic() < deadline, f"{path} never became whole"
        info = [report(r) for r in reports]
        addresses = info[0]["cluster"]["ps"] + info[0]["cluster"]["worker"]
        killed = time.monotonic()
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()

        def serving():
            left = []
            for address in addresses:
                host, port = address.rsplit(":", 1)
                with socket.socket() as s:
                    s.settimeout(5)
                    if s.connect_ex((host, int(port))) == 0:
                        left.append(address)
            return left + [f"worker pid {w['pid']}" for w in info if alive(w["pid"])]

        def alive(pid):  # a zombie has ended
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False
        left = serving()
        while left and time.monotonic() < killed + 60:
            time.sleep(0.1)  # the next look
            left = serving()
        print(f"{time.monotonic() - killed:.1f} s after the driver's SIGKILL, left: {left}")
        assert not left, f"still there 60 s after the driver died: {left}"
    finally:
        # Whatever remains of it (its JVM, pyspark's daemon and workers,
        # which leave the driver's process group), found by the mark.
        driver.kill()
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark.encode() + b"\0" in f.read():
                        os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError):
                pass  # not a process, gone, or not ours to read


def test_an_accept_error_that_persists_does_not_spin():
    """The accept loops of the driver's liveness listener and of DataFeed:
    an error that persists (a closed listener, too many open files) is
    retried every 0.1 s, not at once (which spun a core), and a peer
    without the key is only dropped."""
    import threading
    from multiprocessing import AuthenticationError

    class Failing:
        def __init__(self, error):
            self.error, self.calls = error, 0

        def accept(self):
            self.calls += 1
            raise self.error

    stop = threading.Event()
    broken = Failing(OSError(24, "Too many open files"))
    started = time.monotonic()
    loop = threading.Thread(target=tessera.spark._accept_until,
                            args=(broken, stop, lambda conn: None))
    loop.start()
    stop.wait(0.5)
    stop.set()
    loop.join(5)
    elapsed = time.monotonic() - started
    assert not loop.is_alive()
    assert 1 <= broken.calls <= elapsed / 0.1 + 2, broken.calls

    # A peer without the key: the next one is accepted at once.
    class OneBadPeer:
        def __init__(self):
            self.calls = 0

        def accept(self):
            self.calls += 1
            if self.calls == 1:
                raise AuthenticationError("digest received was wrong")
            return "conn"

    taken = []
    stop = threading.Event()
    tessera.spark._accept_until(OneBadPeer(), stop, lambda c: (taken.append(c), stop.set()))
    assert taken == ["conn"]
