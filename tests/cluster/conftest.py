"""The simulated cluster's fixtures: one cluster per test module, its logs on every failure.

A module asks for a cluster with ``cluster = fleet_fixture(env={...})``; the fixture skips
(with the reason) when this machine cannot build one: not root, no ``ip netns``, no nginx, no
Python 3.13 for mongoeco. Hosts' logs go to a directory pytest keeps (tmp_path_factory);
when a test fails, the last lines of each are added to its report.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster import sim
from tests.cluster.fleet import Account, Addresses, register

CLUSTER_TIMEOUT_S = 600
"""Per test (pytest-timeout), its module's cluster built in the first one's setup: the suite's
default (setup.cfg) is for tests that start one server, not a fleet of them in namespaces."""


def fleet_fixture(**kwargs: Any) -> Callable[..., Iterator[sim.Cluster]]:
    """A module-scoped ``cluster`` fixture building ``sim.Cluster(**kwargs)``."""

    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sim.Cluster]:
        problem = sim.unavailable()
        if problem:
            pytest.skip(problem)
        with sim.Cluster(log_dir=tmp_path_factory.mktemp("cluster-logs"), **kwargs) as built:
            yield built

    return cluster


FIGURES: dict[str, str] = {}
"""What the tests measured (delete visibility, requests lost...), printed at the end of the run."""


@pytest.fixture(scope="session")
def figures() -> dict[str, str]:
    return FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.section("simulated cluster: measured")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture(scope="module")
def addresses(cluster: sim.Cluster) -> Addresses:
    """Client addresses for the module's fleet (its ``cluster`` fixture), each handed out once."""
    return Addresses(cluster)


@pytest.fixture(scope="module")
def account(cluster: sim.Cluster, addresses: Addresses) -> Account:
    """One confirmed, logged-in account on the module's fleet."""
    return register(cluster, addresses.one())


@pytest.fixture(autouse=True)
def whole_fleet_after_a_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a failed test, the fleet mended (``Cluster.heal``): one failure, not a cascade."""
    yield
    report = getattr(request.node, "rep_call", None)
    cluster = request.node.funcargs.get("cluster")
    if report is not None and report.failed and isinstance(cluster, sim.Cluster):
        print(f"mended after the failure: {', '.join(cluster.heal()) or 'nothing'}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(cluster, sim.Cluster) and not hasattr(report, "wasxfail"):
        report.sections.append(("cluster logs", f"(all of them in {cluster.log_dir})\n{cluster.log_tails()}"))
