"""Scale-out tests on the simulated three-node studio (tests/cluster.py)."""

from tests.chaos.conftest import submit  # noqa: F401 - the same job factory
from tests.cluster import cluster, cluster_processes  # noqa: F401 - package-scoped here: the cluster runs for this package only
