"""The Python package's suite runs as the one worker of a real cluster that
`tessera launch` started (run.sh): the client below is that worker's, the
chief."""

import gc
import itertools

import pytest

import tessera

_names = itertools.count()


@pytest.fixture(scope="session")
def client():
    with tessera.Client.from_env(argv=[], op_timeout=60) as c:
        assert c.is_chief and c.num_workers == 1
        yield c
    # pytest.raises keeps tracebacks in reference cycles; collected here they
    # do not outlive the interpreter (nanobind reports any that do as leaks).
    gc.collect()


@pytest.fixture
def name(request):
    """A tensor name of its own for each test (the cluster outlives tests)."""
    return f"{request.node.name}-{next(_names)}"
