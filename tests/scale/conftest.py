"""Scale-out tests on the simulated three-node studio (tests/cluster.py)."""

from tests.chaos.conftest import submit  # noqa: F401 - the same job factory
